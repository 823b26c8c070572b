"""Recursive doubling all-reduce: in round k every rank exchanges its whole vector with the rank
at distance 2^k and both reduce, so after ``log2 P`` rounds all hold the result.

Thakur, Rabenseifner and Gropp 2005, "Optimization of collective communication operations in
MPICH" (IJHPCA 19(1)): the short-message all-reduce. Cost ``log2(P)*(a + n*b + n*g)``: fewest
rounds, most bytes, so it wins for small messages. Other P use the fold of
:mod:`tether.comm.collectives.fold`. Both partners compute ``x + y`` and ``y + x``, which are the
same floating-point number, so all ranks end bitwise identical; but for a NaN, whose sign and
payload follow the operand order (still a NaN on every rank).

All-gather (Thakur 2005, section 3.1): in round k every rank exchanges the ``2^k`` chunks it has
gathered so far with the rank at distance 2^k: ``log2(P)*a + (P-1)/P*n*b``. With the fold, each
folded-in rank first hands its chunk to its odd neighbour, so every rank of the inner algorithm
owns one or two consecutive chunks, and a block of consecutive inner ranks owns consecutive chunks:
every message is still one contiguous range.
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


@lru_cache(maxsize=64)
def recursive_doubling_all_gather(world_size: int) -> Schedule:
    fold = Fold(world_size)

    def first_chunk(virtual: int) -> int:  # inner rank v owns chunks 2v, 2v+1 if folded into
        return 2 * virtual if virtual < fold.extra else virtual + fold.extra

    def last_chunk(virtual: int) -> int:
        return 2 * virtual + 1 if virtual < fold.extra else virtual + fold.extra

    steps = [Step(0, 2 * i, 2 * i + 1, 2 * i, "copy") for i in range(fold.extra)]
    levels = fold.p2.bit_length() - 1
    for k in range(levels):
        for v in range(fold.p2):
            base = v & ~((1 << k) - 1)  # the inner ranks whose chunks v holds after k rounds
            block = tuple(range(first_chunk(base), last_chunk(base + (1 << k) - 1) + 1))
            partner = fold.real(v ^ (1 << k))
            steps.append(Step(fold.offset + k, fold.real(v), partner, block, "copy"))
    steps += fold.fold_out(world_size, fold.offset + levels)
    return Schedule("recursive-doubling-all-gather", world_size, tuple(steps), chunks=world_size)


class RecursiveDoubling(Collective):
    """Recursive doubling all-reduce and all-gather: log2(P) rounds of exchanges (Thakur 2005).

    All-reduce exchanges the whole vector every round; all-gather doubles the block sent."""

    name = "recursive-doubling"
    kinds = ("all_reduce", "all_gather")

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        if kind == "all_gather":
            return recursive_doubling_all_gather(world_size)
        return recursive_doubling_all_reduce(world_size)
