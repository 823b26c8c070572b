"""The fold that lets power-of-two algorithms run on any number of ranks.

Thakur, Rabenseifner and Gropp 2005, "Optimization of collective communication operations in
MPICH" (IJHPCA 19(1)), section 4: with ``p2`` the largest power of two <= P and ``r = P - p2``,
each of the first ``r`` even ranks sends its whole vector to the next odd rank, which reduces it
(one extra round), and sits out; the remaining ``p2`` ranks run the power-of-two algorithm; at the
end the odd ranks send the result back (one extra round). Costs ``a + n*b + n*g`` before and
``a + n*b`` after.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.comm.collectives.schedule import Step, whole_vector


@dataclass(frozen=True)
class Fold:
    world_size: int

    @property
    def p2(self) -> int:
        """The largest power of two <= world_size: the ranks of the inner algorithm."""
        return 1 << (self.world_size.bit_length() - 1)

    @property
    def extra(self) -> int:
        return self.world_size - self.p2

    @property
    def offset(self) -> int:
        """The first round of the inner algorithm (1 when a fold round precedes it)."""
        return 1 if self.extra else 0

    def real(self, virtual: int) -> int:
        """The rank that plays virtual rank ``virtual`` of the inner algorithm."""
        return 2 * virtual + 1 if virtual < self.extra else virtual + self.extra

    def fold_in(self, chunks: int) -> list[Step]:
        every = whole_vector(chunks)
        return [Step(0, 2 * i, 2 * i + 1, every, "reduce") for i in range(self.extra)]

    def fold_out(self, chunks: int, round: int) -> list[Step]:
        every = whole_vector(chunks)
        return [Step(round, 2 * i + 1, 2 * i, every, "copy") for i in range(self.extra)]
