"""The DAG model of one synchronous SGD iteration: naive, wait-free backprop, fusion buckets, and
MG-WFBP's merging (seed 004: Shi, Wang and Chu, "A DAG model of synchronous stochastic gradient
descent in distributed deep learning", ICPADS 2018; Shi, Chu and Li, "MG-WFBP: efficient data
communication for distributed synchronous SGD algorithms", INFOCOM 2019).

Layers are numbered 1..L in forward order; backward runs from L down to 1. ``t_b[l]`` is the
backward time of layer l, ``t_c[l]`` the time of the communication that layer l's gradient
completes (0 when it completes none). With ``tau_b`` the start of a layer's backward and ``tau_c``
the start of its communication (times from the start of backward):

    tau_b(L) = 0,        tau_b(l) = tau_b(l+1) + t_b(l+1)
    tau_c(L) = t_b(L),   tau_c(l) = max(tau_c(l+1) + t_c(l+1), tau_b(l) + t_b(l))
    T_wfbp = t_f + tau_c(1) + t_c(1) + t_u

and without overlap ``T_naive = t_f + sum t_b + sum t_c + t_u``. Invariants (tested):
``t_f + t_b + t_c(1) + t_u <= T_wfbp <= T_naive``. Lists here are 0-based in forward order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

CommTime = Callable[[float], float]  # bytes -> seconds of one all-reduce


@dataclass(frozen=True)
class Iteration:
    """One iteration's predicted time and its parts: ``compute`` (forward, backward, update),
    ``exposed_comm`` (communication not hidden under backward: total - compute)."""

    total_s: float
    compute_s: float
    comm_s: float  # every collective's time, hidden or not

    @property
    def exposed_comm_s(self) -> float:
        return max(0.0, self.total_s - self.compute_s)


def comm_starts(t_b: Sequence[float], t_c: Sequence[float]) -> list[float]:
    """``tau_c`` for every layer (0-based, forward order), by the recurrence above."""
    n = len(t_b)
    tau_b = [0.0] * n
    tau_c = [0.0] * n
    for layer in range(n - 2, -1, -1):
        tau_b[layer] = tau_b[layer + 1] + t_b[layer + 1]
    if n:
        tau_c[n - 1] = t_b[n - 1]
    for layer in range(n - 2, -1, -1):
        tau_c[layer] = max(tau_c[layer + 1] + t_c[layer + 1], tau_b[layer] + t_b[layer])
    return tau_c


def wfbp(t_f: float, t_b: Sequence[float], t_c: Sequence[float], t_u: float) -> Iteration:
    """Wait-free backprop: each layer's communication starts as soon as its gradient is ready
    and the previous communication is done."""
    if not t_b:
        return Iteration(t_f + t_u, t_f + t_u, 0.0)
    tau_c = comm_starts(t_b, t_c)
    compute = t_f + sum(t_b) + t_u
    return Iteration(t_f + tau_c[0] + t_c[0] + t_u, compute, sum(t_c))


def naive(t_f: float, t_b: Sequence[float], t_c: Sequence[float], t_u: float) -> Iteration:
    """No overlap: every communication after the whole backward."""
    compute = t_f + sum(t_b) + t_u
    return Iteration(compute + sum(t_c), compute, sum(t_c))


def bucket_comm(
    tensor_bytes: Sequence[Sequence[int]], bucket_bytes: float | None, comm: CommTime
) -> list[float]:
    """``t_c`` per layer for the fusion layout of :mod:`tether.comm.fusion`: the gradients laid
    out in reverse registration order (backward fills bucket 0 first), cut into fixed slices of
    ``bucket_bytes``; a bucket is ready, and its all-reduce starts, when the layer holding its
    last byte is. A big layer can complete several buckets; ``None``: one message per tensor."""
    n = len(tensor_bytes)
    t_c = [0.0] * n
    if bucket_bytes is None:
        for layer, sizes in enumerate(tensor_bytes):
            t_c[layer] = sum(comm(size) for size in sizes if size)
        return t_c
    total = sum(sum(sizes) for sizes in tensor_bytes)
    if total == 0:
        return t_c
    end_of: list[float] = []  # reverse-layout offset where each layer (backward order) ends
    offset = 0.0
    for layer in range(n - 1, -1, -1):
        offset += sum(tensor_bytes[layer])
        end_of.append(offset)
    start = 0.0
    while start < total:
        end = min(start + bucket_bytes, total)
        # the first layer (in backward order) whose end reaches this bucket's end
        k = next(i for i, e in enumerate(end_of) if e >= end)
        t_c[n - 1 - k] += comm(end - start)
        start = end
    return t_c


@dataclass(frozen=True)
class Merged:
    """MG-WFBP's result: the iteration and the groups of layers (0-based, forward order) whose
    gradients travel as one message each."""

    iteration: Iteration
    groups: tuple[tuple[int, ...], ...]


def mg_wfbp(
    t_f: float,
    t_b: Sequence[float],
    layer_bytes: Sequence[int],
    t_u: float,
    comm: CommTime,
    alpha: float,
) -> Merged:
    """Merge layer l's gradient into layer l-1's message (l-1: the previous layer with
    parameters) when that saves more start-up time than the overlap it loses (``alpha``: the
    all-reduce's start-up): with ``r = tau_b(l-1) + t_b(l-1)`` (when l-1's gradient is ready), merge
    if ``r < tau_c(l) + t_c(l)`` and (``tau_c(l) > r`` or ``r - tau_c(l) < alpha``). Layers are
    decided from L down to 2 with the merges made so far; never predicts more than plain WFBP
    on one message per layer (the merge is kept only if the model agrees, which the rule's
    conditions make the usual case and the check makes certain)."""
    n = len(t_b)
    sizes = [float(b) for b in layer_bytes]  # bytes each layer's message carries after merges
    owner = list(range(n))  # the layer whose message carries layer i's gradient

    def times(current: Sequence[float]) -> list[float]:
        return [comm(size) if size > 0 else 0.0 for size in current]

    best = wfbp(t_f, t_b, times(sizes), t_u)
    for layer in range(n - 1, 0, -1):
        if sizes[layer] <= 0:
            continue
        # "l-1" is the previous layer with a gradient: a layer without parameters (a pooling, an
        # activation) carries no message, and merging into it alone would only delay this one,
        # so the greedy rule refused it and the chain of merges stopped there.
        prev = next((i for i in range(layer - 1, -1, -1) if sizes[i] > 0), None)
        if prev is None:
            break
        t_c = times(sizes)
        tau_c = comm_starts(t_b, t_c)
        ready_prev = sum(t_b[prev:])  # backward has passed layers L..prev: prev's gradient ready
        if not ready_prev < tau_c[layer] + t_c[layer]:
            continue
        if not (tau_c[layer] > ready_prev or ready_prev - tau_c[layer] < alpha):
            continue
        trial = list(sizes)
        trial[prev] += trial[layer]
        trial[layer] = 0.0
        candidate = wfbp(t_f, t_b, times(trial), t_u)
        if candidate.total_s <= best.total_s:
            sizes, best = trial, candidate
            owner = [prev if o == layer else o for o in owner]
    groups: dict[int, list[int]] = {}
    for layer, o in enumerate(owner):
        groups.setdefault(o, []).append(layer)
    return Merged(best, tuple(tuple(g) for _, g in sorted(groups.items())))
