"""Recursive halving-doubling all-reduce (Rabenseifner's algorithm), for any number of ranks.

Rabenseifner 2004, "Optimization of collective reduction operations" (ICCS), and Thakur,
Rabenseifner and Gropp 2005 (MPICH). Reduce-scatter by recursive halving: in round k a rank
exchanges half of its current range of chunks with the partner at distance ``p2 / 2^(k+1)``,
keeping (and reducing into) the half selected by its own bit; after ``log2 p2`` rounds virtual
rank v holds the finished chunk v. All-gather by recursive doubling retraces the steps, distances
growing. Cost for a power of two: ``2*log2(P)*a + 2(P-1)/P*n*b + (P-1)/P*n*g``. Other P use the
fold of :mod:`tether.comm.collectives.fold` (two extra rounds of the whole vector).
"""

from __future__ import annotations

from functools import lru_cache

from tether.comm.collectives.base import Collective
from tether.comm.collectives.fold import Fold
from tether.comm.collectives.schedule import Schedule, Step


@lru_cache(maxsize=64)
def halving_doubling_all_reduce(world_size: int) -> Schedule:
    fold = Fold(world_size)
    p2, levels = fold.p2, fold.p2.bit_length() - 1
    steps = fold.fold_in(p2)
    # ranges[v] is the [lo, hi) range of chunks virtual rank v is responsible for
    ranges = [(0, p2)] * p2
    history = []
    for k in range(levels):
        dist = p2 >> (k + 1)
        history.append(list(ranges))
        new = []
        for v in range(p2):
            lo, hi = ranges[v]
            mid = (lo + hi) // 2
            new.append((lo, mid) if v & dist == 0 else (mid, hi))
        for v in range(p2):
            partner = v ^ dist
            keep = tuple(range(*new[partner]))  # partner's half: v sends it, partner reduces
            steps.append(Step(fold.offset + k, fold.real(v), fold.real(partner), keep, "reduce"))
        ranges = new
    for k in range(levels):
        dist = 1 << k
        round_ = fold.offset + levels + k
        for v in range(p2):
            mine = tuple(range(*ranges[v]))
            steps.append(Step(round_, fold.real(v), fold.real(v ^ dist), mine, "copy"))
        ranges = history[levels - 1 - k]
    steps += fold.fold_out(p2, fold.offset + 2 * levels)
    return Schedule("halving-doubling", world_size, tuple(steps), chunks=p2)


class HalvingDoubling(Collective):
    """Rabenseifner's recursive halving-doubling all-reduce (any P, by the MPICH fold)."""

    name = "halving-doubling"
    kinds = ("all_reduce",)

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        return halving_doubling_all_reduce(world_size)
