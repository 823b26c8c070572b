"""The tensors one call of a compiled plan works on: slices of the vector and of scratch buffers.

A plan (:mod:`tether.comm.collectives.plan`) names element ranges; a call needs them as tensor
views, and slicing costs ~4 us a view (torch's indexing, warm; several times that right after a
barrier, when caches are cold), a sizeable part of a 1 MiB all-reduce between 2 ranks: cutting
the slicing out took the fastest quarter of 2-rank 1 MiB ring calls on a 2-core VM from
1.46-1.50 to 1.28-1.34 ms (both timed in the same runs). A 1-D vector reduced again and again (a
fusion bucket, a benchmark's buffer) gets its views cut once: they are cached per thread, keyed
by the tensor object, checked against its storage address on every call, and dropped when the
tensor is (a weak reference; the views are cut from a detached alias, which does not keep the
tensor object alive).

Received pieces that are reduced land in scratch buffers, two per thread, dtype and device (even
rounds use one, odd rounds the other), so a round's receives can be posted while the previous
round's still land.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import torch

from tether.comm.collectives.plan import RoundPlan

RoundTensors = tuple[
    list[tuple[torch.Tensor, int]],  # sends: (tensor, destination)
    list[tuple[torch.Tensor, int]],  # receives: (buffer, source), the reduced pieces first
    list[tuple[torch.Tensor, torch.Tensor]],  # reductions: (own range, its scratch piece)
]

_local = threading.local()
MAX_CACHED = 64  # vectors whose views a thread keeps; far more than a run's fusion buckets


def scratch(numel: int, like: torch.Tensor, slot: int = 0) -> torch.Tensor:
    """A receive buffer of ``numel`` elements of ``like``'s dtype and device, reused across
    rounds and calls (per thread): a fresh multi-MiB ``empty`` every round costs page faults
    comparable to the copy itself. Valid until the next call on this thread with this slot."""
    buffers: dict[tuple[torch.dtype, torch.device, int], torch.Tensor] = _local.__dict__.setdefault(
        "buffers", {}
    )
    key = (like.dtype, like.device, slot)
    buf = buffers.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=like.dtype, device=like.device)
        buffers[key] = buf
    return buf[:numel]


def round_tensors(rp: RoundPlan, flat: torch.Tensor, slot: int) -> RoundTensors:
    """Round ``rp``'s views of ``flat`` and of scratch buffer ``slot``."""
    sends = [(flat[t.start : t.stop], t.peer) for t in rp.sends]
    buf = scratch(rp.scratch_numel, flat, slot) if rp.reductions else flat[:0]
    reductions = [
        (flat[red.start : red.stop], buf[red.offset : red.offset + red.stop - red.start])
        for red in rp.reductions
    ]
    # reduced pieces first, so that receive handle k is reduction k's
    recvs = [(piece, red.peer) for (_, piece), red in zip(reductions, rp.reductions, strict=True)]
    recvs += [(flat[t.start : t.stop], t.peer) for t in rp.copies]
    return sends, recvs, reductions


Entry = tuple[weakref.ref, int, Sequence[RoundPlan], list[RoundTensors]]


def _cache() -> dict[int, Entry]:
    try:
        return _local.views
    except AttributeError:  # this thread's first call
        _local.views = {}
        return _local.views


def cached_views(plan: Sequence[RoundPlan], flat: torch.Tensor) -> list[RoundTensors] | None:
    """Every round's views of ``flat`` for ``plan`` (round ``i`` in scratch slot ``i % 2``), if
    an earlier call on this same tensor object, with its storage unchanged, left them."""
    entry = _cache().get(id(flat))
    if (
        entry is None
        or entry[0]() is not flat
        or entry[1] != flat.data_ptr()
        or entry[2] is not plan
    ):
        return None
    return entry[3]


def remember_views(
    plan: Sequence[RoundPlan], flat: torch.Tensor, views: list[RoundTensors]
) -> None:
    """Keep ``views`` (cut from ``flat.detach()``, so that they do not keep ``flat`` alive) for
    the next call on ``flat``; forgotten when ``flat`` is."""
    cache, key = _cache(), id(flat)
    if len(cache) >= MAX_CACHED:
        cache.clear()

    def forget(ref: weakref.ref) -> None:
        held = cache.get(key)
        if held is not None and held[0] is ref:
            del cache[key]

    cache[key] = (weakref.ref(flat, forget), flat.data_ptr(), plan, views)
