"""Timing a model's training step layer by layer, on the running machine: the workload that
``tether calibrate`` writes and ``tether predict`` reads (:class:`tether.perf.workload.Workload`).

A layer is a module with parameters of its own, in the order its forward runs. Its forward time is
taken between forward hooks; its backward time is the interval between its gradients becoming
ready and the previous layer's (in backward order; the first from the start of backward), read
from ``register_post_accumulate_grad_hook``: exactly the quantity wait-free backprop depends on,
including the backward of the parameterless operations in between. Forward time outside the
layers (activations, pooling, the loss) goes to a last ``(other)`` layer without parameters. FLOPs
are torch's own count (``torch.utils.flop_counter``) of one forward, per module. Times are the
median over ``repeats`` steps after ``warmup`` untimed ones.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tether.perf.workload import LayerCost, Workload

OTHER = "(other)"


def _layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [
        (name, module)
        for name, module in model.named_modules()
        if any(p.requires_grad for p in module.parameters(recurse=False))
    ]


def _forward_flops(model: nn.Module, inputs: Any, names: list[str]) -> dict[str, float]:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(inputs)
    counts = counter.get_flop_counts()
    root = type(model).__name__
    flops = {name: float(sum(counts.get(f"{root}.{name}", {}).values())) for name in names}
    total = float(sum(counts.get("Global", {}).values()))
    flops[OTHER] = max(0.0, total - sum(flops.values()))
    return flops


def measure_workload(
    model: nn.Module,
    inputs: Any,
    targets: Any,
    loss: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
    name: str,
    measured_on: str,
    repeats: int = 20,
    warmup: int = 3,
) -> Workload:
    """Time ``repeats`` training steps of ``model`` on one batch; the per-layer medians.

    ``inputs`` and ``targets`` are one batch (its first dimension is the batch size)."""
    layers = _layers(model)
    names = [n for n, _ in layers]
    flops = _forward_flops(model, inputs, names)
    starts: dict[str, float] = {}
    forward: dict[str, list[float]] = {n: [] for n in names}
    ready: dict[str, float] = {}
    hooks = []
    for layer_name, module in layers:
        hooks.append(
            module.register_forward_pre_hook(
                lambda _m, _i, n=layer_name: starts.__setitem__(n, time.perf_counter())
            )
        )
        hooks.append(
            module.register_forward_hook(
                lambda _m, _i, _o, n=layer_name: forward[n].append(time.perf_counter() - starts[n])
            )
        )
        for p in module.parameters(recurse=False):
            if p.requires_grad:
                hooks.append(
                    p.register_post_accumulate_grad_hook(
                        lambda _p, n=layer_name: ready.__setitem__(n, time.perf_counter())
                    )
                )
    total_forward: list[float] = []
    backward: dict[str, list[float]] = {n: [] for n in names}
    try:
        for i in range(warmup + repeats):
            t0, t1, _, _ = _timed_step(model, inputs, targets, loss, optimizer)
            if i < warmup:
                continue
            total_forward.append(t1 - t0)
            previous = t1  # backward starts when the loss is ready
            for n in reversed(names):  # backward order
                when = ready.get(n, previous)
                backward[n].append(max(0.0, when - previous))
                previous = max(previous, when)
            ready.clear()
    finally:
        for hook in hooks:
            hook.remove()
    batch = int(inputs.shape[0]) if hasattr(inputs, "shape") else 1
    # The hooks cost time of their own (a tenth of LeNet-5's step): they give each layer's share,
    # and the totals come from the same steps timed without them.
    clean_forward, clean_backward, clean_update = _clean_step(
        model, inputs, targets, loss, optimizer, repeats
    )
    hooked_forward = statistics.median(total_forward)
    forward_medians = {
        n: statistics.median(forward[n][-repeats:]) * clean_forward / hooked_forward for n in names
    }
    backward_medians = {n: statistics.median(backward[n]) for n in names}
    hooked_backward = sum(backward_medians.values())
    scale = clean_backward / hooked_backward if hooked_backward > 0 else 0.0
    module_of = dict(layers)
    costs = [
        LayerCost(
            name=n,
            tensor_bytes=tuple(
                p.numel() * p.element_size()
                for p in module_of[n].parameters(recurse=False)
                if p.requires_grad
            ),
            forward_flops=flops[n],
            forward_s=forward_medians[n],
            backward_s=backward_medians[n] * scale,
        )
        for n in names
    ]
    other = max(0.0, clean_forward - sum(forward_medians.values()))
    costs.append(LayerCost(OTHER, (), flops[OTHER], other, 0.0))
    return Workload(
        model=name,
        batch_size=batch,
        layers=tuple(costs),
        update_s=clean_update,
        measured_on=measured_on,
    )


def _clean_step(
    model: nn.Module,
    inputs: Any,
    targets: Any,
    loss: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
    repeats: int,
) -> tuple[float, float, float]:
    """Median forward (with the loss), backward and update seconds of steps without hooks."""
    times: list[tuple[float, float, float]] = []
    for i in range(repeats + 1):
        t0, t1, t2, t3 = _timed_step(model, inputs, targets, loss, optimizer)
        if i:  # the first is a warm-up
            times.append((t1 - t0, t2 - t1, t3 - t2))
    forward, backward, update = (statistics.median(column) for column in zip(*times, strict=True))
    return forward, backward, update


def _timed_step(
    model: nn.Module,
    inputs: Any,
    targets: Any,
    loss: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
) -> tuple[float, float, float, float]:
    """One training step; ``time.perf_counter()`` at its start, after the loss, after backward
    and after the update."""
    optimizer.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    value = loss(model(inputs), targets)
    t1 = time.perf_counter()
    value.backward()
    t2 = time.perf_counter()
    optimizer.step()
    return t0, t1, t2, time.perf_counter()
