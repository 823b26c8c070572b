"""Recursive doubling all-reduce: in round k every rank exchanges its whole vector with the rank
at distance 2^k and both reduce, so after ``log2 P`` rounds all hold the result.

Thakur, Rabenseifner and Gropp 2005, "Optimization of collective communication operations in
MPICH" (IJHPCA 19(1)): the short-message all-reduce. Cost ``log2(P)*(a + n*b + n*g)``: fewest
rounds, most bytes, so it wins for small messages. Other P use the fold of
:mod:`tether.comm.collectives.fold`. Both partners compute ``x + y`` and ``y + x``, which are the
same floating-point number, so all ranks end bitwise identical.
"""

from __future__ import annotations

from functools import lru_cache

from tether.comm.collectives.base import Collective
from tether.comm.collectives.fold import Fold
from tether.comm.collectives.schedule import Schedule, Step


@lru_cache(maxsize=64)
def recursive_doubling_all_reduce(world_size: int) -> Schedule:
    fold = Fold(world_size)
    levels = fold.p2.bit_length() - 1
    steps = fold.fold_in(1)
    for k in range(levels):
        for v in range(fold.p2):
            partner = fold.real(v ^ (1 << k))
            steps.append(Step(fold.offset + k, fold.real(v), partner, 0, "reduce"))
    steps += fold.fold_out(1, fold.offset + levels)
    return Schedule("recursive-doubling", world_size, tuple(steps))


class RecursiveDoubling(Collective):
    """Recursive doubling all-reduce: log2(P) rounds of whole-vector exchanges (Thakur 2005)."""

    name = "recursive-doubling"
    kinds = ("all_reduce",)

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        return recursive_doubling_all_reduce(world_size)
