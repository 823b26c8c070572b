"""Binomial-tree reduce and broadcast, and all-reduce as reduce followed by broadcast.

Thakur, Rabenseifner and Gropp 2005, "Optimization of collective communication operations in
MPICH" (IJHPCA 19(1)), sections 3-4. With ranks renumbered relative to the root, in reduce round
k the rank whose lowest set bit is bit k sends its partial result to ``rel - 2^k``; broadcast runs
the same tree top down. Each takes ``ceil(log2 P)`` rounds: ``ceil(log2 P)*(a + n*b [+ n*g])``
(docs/communication.md; the tree of the paper's sync EASGD). The result is reduced at the root
and copied out, so an all-reduce ends bitwise identical on all ranks.

All-gather is a gather up the same tree to rank 0 (in round k the rank ``rel`` with lowest set
bit k sends the ``2^k`` chunks ``rel ... rel + 2^k - 1`` it has gathered) followed by a broadcast
of the whole vector: ``ceil(log2 P)*a + (P-1)/P*n*b`` up, ``ceil(log2 P)*(a + n*b)`` down.
"""

from __future__ import annotations

from functools import lru_cache

from tether.comm.collectives.base import Collective
from tether.comm.collectives.schedule import Schedule, Step, whole_vector


def _levels(world_size: int) -> int:
    return (world_size - 1).bit_length()  # ceil(log2 P)


@lru_cache(maxsize=64)
def binomial_reduce(world_size: int, root: int) -> Schedule:
    p, steps = world_size, []
    for k in range(_levels(p)):
        mask = 1 << k
        for rel in range(mask, p, 2 * mask):
            steps.append(Step(k, (rel + root) % p, (rel - mask + root) % p, 0, "reduce"))
    return Schedule("binomial-reduce", p, tuple(steps), root=root)


@lru_cache(maxsize=64)
def binomial_broadcast(
    world_size: int, root: int, first_round: int = 0, chunks: int = 1
) -> Schedule:
    """``chunks``: how many chunks the vector is cut into (all of them travel together)."""
    every = whole_vector(chunks)
    p, levels, steps = world_size, _levels(world_size), []
    for k in range(levels):
        mask = 1 << (levels - 1 - k)
        for rel in range(0, p - mask, 2 * mask):
            steps.append(
                Step(first_round + k, (rel + root) % p, (rel + mask + root) % p, every, "copy")
            )
    return Schedule("binomial-broadcast", p, tuple(steps), chunks, root=root)


@lru_cache(maxsize=64)
def binomial_all_reduce(world_size: int) -> Schedule:
    levels = _levels(world_size)
    steps = binomial_reduce(world_size, 0).steps + binomial_broadcast(world_size, 0, levels).steps
    return Schedule("binomial", world_size, steps)


@lru_cache(maxsize=64)
def binomial_all_gather(world_size: int) -> Schedule:
    p, levels, steps = world_size, _levels(world_size), []
    for k in range(levels):
        mask = 1 << k
        for rel in range(mask, p, 2 * mask):
            block = tuple(range(rel, min(rel + mask, p)))
            steps.append(Step(k, rel, rel - mask, block, "copy"))
    steps += binomial_broadcast(p, 0, levels, chunks=p).steps
    return Schedule("binomial-all-gather", p, tuple(steps), chunks=p)


class Binomial(Collective):
    """Binomial-tree reduce and broadcast; all-reduce and all-gather go up, then down (MPICH).

    All-reduce is a reduce then a broadcast; all-gather a gather then a broadcast."""

    name = "binomial"
    kinds = ("all_reduce", "broadcast", "reduce", "all_gather")

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        if kind == "all_reduce":
            return binomial_all_reduce(world_size)
        if kind == "all_gather":
            return binomial_all_gather(world_size)
        if kind == "reduce":
            return binomial_reduce(world_size, root)
        return binomial_broadcast(world_size, root)
