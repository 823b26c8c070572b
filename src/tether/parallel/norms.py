"""Whole-model quantities of a sharded model: the gradient's global norm, and the overflow flag.

A split parameter's gradient lives in slices over its model group, so a norm taken on one rank
sees only its slice: each rank would clip by another coefficient and the replicated parameters
(a row-parallel layer's bias, the layers the plan leaves whole) would drift apart across the
group. The squared norm is a sum, so the sliced parameters' part is all-reduced over the group
and the replicated part, the same on every rank, is added once (as Megatron-LM's
``clip_grad_norm`` does over its tensor-parallel group). Likewise an fp16 overflow in one
rank's slice must make every rank of the group skip the step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tether.comm.transport import Transport
from tether.parallel.parallelize import sharded_layers


def split_parameters(model: nn.Module) -> list[tuple[Transport, list[nn.Parameter]]]:
    """The model's split parameters with the group each is split over (one group per model in
    practice; several are reduced one after the other, in the same order on every rank)."""
    groups: dict[int, tuple[Transport, list[nn.Parameter]]] = {}
    for layer in sharded_layers(model).values():
        _, params = groups.setdefault(id(layer.group), (layer.group, []))
        for name, dim in layer.split_dims.items():
            param = getattr(layer, name)
            if dim is not None and param is not None:
                params.append(param)
    return list(groups.values())


def reduce_trust_norms(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """LARS's and LAMB's per-tensor norms of the split parameters summed over their group
    (their optimizers' hook, :meth:`tether.optim.trust.TrustRatio.reduce_norms`), so the trust
    ratios are the whole tensors'. Other optimizers take no norm: nothing to do."""
    register = getattr(optimizer, "reduce_norms", None)
    if register is None:
        return
    for group, params in split_parameters(model):
        register(params, group.all_reduce)


def grad_norm(model: nn.Module) -> torch.Tensor:
    """The L2 norm of the whole (unsharded) model's gradient, the same on every rank.
    Collective over each model group."""
    split = split_parameters(model)
    in_groups = {id(p) for _, params in split for p in params}
    whole = [p for p in model.parameters() if id(p) not in in_groups]
    total = _squared(whole)
    for group, params in split:
        part = _squared(params).reshape(1)
        group.all_reduce(part)  # every rank of the group contributes its slices
        total = total + part[0]
    return total.sqrt()


def _squared(params: list[nn.Parameter]) -> torch.Tensor:
    """The sum of the squared gradient entries of ``params`` (float64, on the CPU)."""
    total = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is not None:
            total += p.grad.detach().double().pow(2).sum().cpu()
    return total


def clip_grad_norm_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` of the whole model's gradient on a sharded model
    (its formula: scale by ``max_norm / (norm + 1e-6)`` when that is below 1); returns the norm.
    Every rank of a group clips by the same coefficient."""
    norm = grad_norm(model)
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, coefficient.to(grads[0].dtype).item())
    return norm


def shared_over(
    group: Transport, first: Callable[[torch.Tensor], None] | None
) -> Callable[[torch.Tensor], None]:
    """An overflow flag's sharing that, after ``first`` (the method's own, if any), also takes
    the MAX over ``group`` (the model group): every rank of the grid then skips together."""

    def share(flag: torch.Tensor) -> None:
        if first is not None:
            first(flag)
        group.all_reduce(flag, op="max")

    return share
