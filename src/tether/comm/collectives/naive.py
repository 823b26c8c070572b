"""Naive collectives, the correctness oracle: the root talks to every other rank in turn.

All-reduce is a reduce to rank 0 followed by a broadcast from it; a reduce receives the P-1
contributions one per round in rank order, a broadcast sends P-1 copies one per round. This is
the baseline the tree and ring algorithms improve on: ``(P-1)(a + n*b [+ n*g])`` per phase
(docs/communication.md; Thakur, Rabenseifner and Gropp 2005 use it as the reference
point). Its summation order ``((x_root + x_a) + x_b) + ...`` is fixed and easy to reason about.
All-gather is a gather to rank 0 (each rank's chunk, one per round) followed by a broadcast of
the whole vector: ``(P-1)(a + n/P*b) + (P-1)(a + n*b)``.
"""

from __future__ import annotations

from functools import lru_cache

from tether.comm.collectives.base import Collective
from tether.comm.collectives.schedule import Schedule, Step, whole_vector


def _others(world_size: int, root: int) -> list[int]:
    return [(root + k) % world_size for k in range(1, world_size)]


@lru_cache(maxsize=64)
def naive_reduce(world_size: int, root: int) -> Schedule:
    steps = [Step(k, src, root, 0, "reduce") for k, src in enumerate(_others(world_size, root))]
    return Schedule("naive-reduce", world_size, tuple(steps), root=root)


@lru_cache(maxsize=64)
def naive_broadcast(world_size: int, root: int, first_round: int = 0, chunks: int = 1) -> Schedule:
    """``chunks``: how many chunks the vector is cut into (all of them travel together)."""
    every = whole_vector(chunks)
    others = _others(world_size, root)
    steps = [Step(first_round + k, root, dst, every, "copy") for k, dst in enumerate(others)]
    return Schedule("naive-broadcast", world_size, tuple(steps), chunks, root=root)


@lru_cache(maxsize=64)
def naive_all_reduce(world_size: int) -> Schedule:
    steps = naive_reduce(world_size, 0).steps + naive_broadcast(world_size, 0, world_size - 1).steps
    return Schedule("naive", world_size, steps)


@lru_cache(maxsize=64)
def naive_all_gather(world_size: int) -> Schedule:
    p = world_size
    gather = [Step(k, src, 0, src, "copy") for k, src in enumerate(_others(p, 0))]
    steps = (*gather, *naive_broadcast(p, 0, p - 1, chunks=p).steps)
    return Schedule("naive-all-gather", p, steps, chunks=p)


class Naive(Collective):
    """Reduce (or gather) to the root, then broadcast, one rank at a time: the oracle."""

    name = "naive"
    kinds = ("all_reduce", "broadcast", "reduce", "all_gather")

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        if kind == "all_reduce":
            return naive_all_reduce(world_size)
        if kind == "all_gather":
            return naive_all_gather(world_size)
        if kind == "reduce":
            return naive_reduce(world_size, root)
        return naive_broadcast(world_size, root)
