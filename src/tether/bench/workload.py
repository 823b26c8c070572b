"""Timing a model's training step layer by layer, on the running machine: the workload that
``tether calibrate`` writes and ``tether predict`` reads (:class:`tether.perf.workload.Workload`).

A layer is a module with parameters of its own (a weight tied between two modules belongs to the
first, and its bytes are counted once), in the order one forward first calls them. Its forward
time is taken between forward hooks, less the time of the layers inside it (so a block with a
parameter of its own and layers inside is not counted twice), summed over its calls in one step
(a module applied twice costs twice; one whose forward never runs, as
``nn.MultiheadAttention``'s ``out_proj``, whose weight its parent uses directly, costs nothing
there); its backward time is the interval between its gradients becoming ready and the previous
layer's (in backward order; the first from the start of backward), read from
``register_post_accumulate_grad_hook``: exactly the quantity wait-free backprop depends on,
including the backward of the parameterless operations in between. Forward time outside the
layers (activations, pooling, the loss) goes to a last ``(other)`` layer without parameters.
FLOPs are torch's own count (``torch.utils.flop_counter``) of one forward, per module, less the
layers inside it. Times are the median over ``repeats`` steps after ``warmup`` untimed ones.
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


def _layers(model: nn.Module) -> list[tuple[str, tuple[nn.Parameter, ...]]]:
    """(name, its trainable parameters not held by an earlier layer), for every module that has
    any."""
    seen: set[int] = set()
    layers = []
    for name, module in model.named_modules():
        own = tuple(
            p for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in seen
        )
        if own:
            seen.update(id(p) for p in own)
            layers.append((name, own))
    return layers


def _in_forward_order(
    model: nn.Module,
    modules: dict[str, nn.Module],
    layers: list[tuple[str, tuple[nn.Parameter, ...]]],
    inputs: Any,
) -> list[tuple[str, tuple[nn.Parameter, ...]]]:
    """``layers`` in the order one forward first calls them (wait-free backprop's order, which
    a model's declaration need not follow); a layer whose forward never runs goes right after
    its nearest ancestor that runs (its gradient is computed by that one's backward), else
    last."""
    called: dict[str, int] = {}

    def note(name: str) -> None:  # a pre-hook that returns something replaces the inputs
        called.setdefault(name, len(called))

    hooks = [
        modules[name].register_forward_pre_hook(lambda _m, _i, n=name: note(n))
        for name, _ in layers
    ]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for hook in hooks:
            hook.remove()

    def position(name: str) -> float:
        ancestor = name
        while ancestor not in called and ancestor:
            ancestor = ancestor.rpartition(".")[0]
        if ancestor in called:
            return called[ancestor] + (0.5 if ancestor != name else 0.0)
        return float(len(layers))

    return sorted(layers, key=lambda layer: position(layer[0]))  # stable: ties as declared


def _outermost_inside(name: str, names: list[str]) -> list[str]:
    """The layers inside ``name`` with no other layer of ``names`` between them and it."""
    prefix = f"{name}." if name else ""
    inside = [n for n in names if n != name and n.startswith(prefix)]
    return [n for n in inside if not any(n.startswith(f"{m}.") for m in inside if m != n)]


def _forward_flops(model: nn.Module, inputs: Any, names: list[str]) -> dict[str, float]:
    """Each layer's own forward FLOPs (torch counts a module with the modules inside it)."""
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(inputs)
    counts = counter.get_flop_counts()
    root = type(model).__name__
    whole = {
        name: float(sum(counts.get(f"{root}.{name}" if name else root, {}).values()))
        for name in names
    }
    flops = {
        name: max(0.0, whole[name] - sum(whole[n] for n in _outermost_inside(name, names)))
        for name in names
    }
    total = float(sum(counts.get("Global", {}).values()))
    flops[OTHER] = max(0.0, total - sum(flops.values()))
    return flops


def batch_size_of(inputs: Any) -> int:
    """The first dimension of the first tensor in ``inputs`` (a tensor, or a tuple, list or
    dict of them); 1 when there is none."""
    if isinstance(inputs, torch.Tensor):
        return int(inputs.shape[0]) if inputs.dim() else 1
    if isinstance(inputs, dict):
        inputs = list(inputs.values())
    if isinstance(inputs, list | tuple):
        for item in inputs:
            if isinstance(item, torch.Tensor | list | tuple | dict):
                return batch_size_of(item)
    return 1


class _ForwardClock:
    """Forward hooks that time each layer's own forward in one step: from its pre-hook to its
    hook, less the layers that ran inside it, summed over its calls."""

    def __init__(self, names: list[str]) -> None:
        self.step: dict[str, float] = dict.fromkeys(names, 0.0)
        self._open: list[list[float]] = []  # per open layer: [start, time of layers inside]

    def enter(self, _name: str) -> None:
        self._open.append([time.perf_counter(), 0.0])

    def leave(self, name: str) -> None:
        start, inside = self._open.pop()
        spent = time.perf_counter() - start
        self.step[name] += spent - inside
        if self._open:
            self._open[-1][1] += spent

    def take(self) -> dict[str, float]:
        """This step's times, cleared for the next."""
        taken, self.step = self.step, dict.fromkeys(self.step, 0.0)
        self._open.clear()
        return taken


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
    modules = dict(model.named_modules())
    layers = _in_forward_order(model, modules, _layers(model), inputs)
    names = [n for n, _ in layers]
    flops = _forward_flops(model, inputs, names)
    clock = _ForwardClock(names)
    forward: dict[str, list[float]] = {n: [] for n in names}
    ready: dict[str, float] = {}
    hooks = []
    for layer_name, params in layers:
        module = modules[layer_name]
        hooks.append(module.register_forward_pre_hook(lambda _m, _i, n=layer_name: clock.enter(n)))
        hooks.append(module.register_forward_hook(lambda _m, _i, _o, n=layer_name: clock.leave(n)))
        for p in params:
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
            step_forward = clock.take()
            if i < warmup:
                ready.clear()
                continue
            total_forward.append(t1 - t0)
            for n in names:
                forward[n].append(step_forward[n])
            previous = t1  # backward starts when the loss is ready
            for n in reversed(names):  # backward order
                when = ready.get(n, previous)
                backward[n].append(max(0.0, when - previous))
                previous = max(previous, when)
            ready.clear()
    finally:
        for hook in hooks:
            hook.remove()
    batch = batch_size_of(inputs)
    # The hooks cost time of their own (a tenth of LeNet-5's step): they give each layer's share,
    # and the totals come from the same steps timed without them.
    clean_forward, clean_backward, clean_update = _clean_step(
        model, inputs, targets, loss, optimizer, repeats
    )
    hooked_forward = statistics.median(total_forward)
    forward_medians = {
        n: statistics.median(forward[n]) * clean_forward / hooked_forward for n in names
    }
    backward_medians = {n: statistics.median(backward[n]) for n in names}
    hooked_backward = sum(backward_medians.values())
    scale = clean_backward / hooked_backward if hooked_backward > 0 else 0.0
    params_of = dict(layers)
    costs = [
        LayerCost(
            name=n,
            tensor_bytes=tuple(p.numel() * p.element_size() for p in params_of[n]),
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
