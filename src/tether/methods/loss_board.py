"""Each Hogwild worker's training losses, on a board the server reads without a lock.

Per worker three float64 words: the sum of its losses, their count, and a sequence number. The
worker (the only writer of its words) makes the sequence odd before it changes the pair and even
after; a reader takes a pair only when it read the same even sequence before and after it (a
sequence lock, as Linux's seqlock). Without it a reader could take a sum that already holds a
loss whose count it had not seen, and log a doubled loss, then a loss of 0 for the next step.
The stores of one writer reach every reader in order on x86 (total store order); there the pair
a reader takes is always whole.
"""

from __future__ import annotations

import torch

WORDS_PER_WORKER = 3  # sum, count, sequence
READ_TRIES = 1000  # a writer holds its words for two additions: a few tries are enough


class LossBoard:
    """The board over ``words`` (``WORDS_PER_WORKER`` float64 per worker: shared memory, or the
    server's own tensor)."""

    def __init__(self, words: torch.Tensor) -> None:
        assert words.dtype == torch.float64 and words.numel() % WORDS_PER_WORKER == 0
        self.words = words

    @staticmethod
    def size(workers: int) -> int:
        return WORDS_PER_WORKER * workers

    def add(self, slot: int, loss_sum: float, steps: int) -> None:
        """Add ``steps`` losses summing to ``loss_sum`` to worker ``slot``'s words (its writer
        only)."""
        base = WORDS_PER_WORKER * slot
        self.words[base + 2] += 1  # odd: the pair is changing
        self.words[base] += loss_sum
        self.words[base + 1] += steps
        self.words[base + 2] += 1  # even: whole again

    def read(self, slot: int) -> tuple[float, int] | None:
        """(sum, count) of worker ``slot`` as one pair; None if its writer kept changing it."""
        base = WORDS_PER_WORKER * slot
        for _ in range(READ_TRIES):
            before = float(self.words[base + 2])
            if before % 2:
                continue
            total, count = float(self.words[base]), int(self.words[base + 1])
            if float(self.words[base + 2]) == before:
                return total, count
        return None
