"""Ring all-reduce: reduce-scatter then all-gather around the ring 0 -> 1 -> ... -> P-1 -> 0.

Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations"
(JPDC 69(2)); also Thakur, Rabenseifner and Gropp 2005 (MPICH). The vector is cut into P chunks
(lengths not divisible by P give chunks one element apart; chunks of length 0 move nothing). In
reduce-scatter round r, rank i sends chunk (i - r) mod P to rank i+1, which adds it to its own;
after P-1 rounds rank i holds the finished chunk (i + 1) mod P. In all-gather round r rank i
forwards chunk (i + 1 - r) mod P. Cost: ``2(P-1)a + 2(P-1)/P*n*b + (P-1)/P*n*g``, whose bandwidth
term is the lower bound for all-reduce. Every chunk is reduced in one place and then copied, so
all ranks end bitwise identical.

All-gather is the second phase alone, with rank i starting from its own chunk i: in round r it
forwards chunk (i - r) mod P; ``(P-1)a + (P-1)/P*n*b``, again the bandwidth lower bound.
"""

from __future__ import annotations

from functools import lru_cache

from tether.comm.collectives.base import Collective
from tether.comm.collectives.schedule import Schedule, Step


def _all_gather_steps(p: int, first_round: int, shift: int) -> list[Step]:
    """The all-gather phase: rank i starts with chunk ``(i + shift) mod P`` finished and in
    round r forwards chunk ``(i + shift - r) mod P`` to rank i+1."""
    return [
        Step(first_round + r, i, (i + 1) % p, (i + shift - r) % p, "copy")
        for r in range(p - 1)
        for i in range(p)
    ]


@lru_cache(maxsize=64)
def ring_all_reduce(world_size: int) -> Schedule:
    p = world_size
    steps = []
    for r in range(p - 1):
        steps += [Step(r, i, (i + 1) % p, (i - r) % p, "reduce") for i in range(p)]
    # after reduce-scatter, rank i holds the finished chunk (i + 1) mod P
    steps += _all_gather_steps(p, p - 1, 1)
    return Schedule("ring", p, tuple(steps), chunks=p)


@lru_cache(maxsize=64)
def ring_all_gather(world_size: int) -> Schedule:
    return Schedule(
        "ring-all-gather", world_size, tuple(_all_gather_steps(world_size, 0, 0)), chunks=world_size
    )


class Ring(Collective):
    """Ring all-reduce (reduce-scatter + all-gather; Patarasuk and Yuan 2009) and all-gather."""

    name = "ring"
    kinds = ("all_reduce", "all_gather")

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        if kind == "all_gather":
            return ring_all_gather(world_size)
        return ring_all_reduce(world_size)
