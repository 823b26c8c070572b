"""How timing rounds are formed where algorithms are compared: the order in which a round runs
them, and how many back-to-back calls one timed round holds.

``tether bench comm`` and the calibration time several algorithms side by side: round 1 of every
algorithm, then round 2, ... so that a slow spell of the machine hits them alike. A fixed order
within the rounds leaves a position effect: on 2 ranks of the 2-core test machine, native timed
last in each round ran 0.71x-0.87x native timed first (the same code). Rotating the order, each
round starting one further along, puts every algorithm in every position equally often.

Both time a round the same way (nccl-tests' scheme): a barrier, then :func:`iters_for` calls
back to back, divided by their number. One call right after a barrier is a different regime for
small messages: 4 ranks of the 2-core machine, 4 bytes, gloo's all-reduce took 0.9-1.7 ms alone
after a barrier and 0.74-0.82 ms a call in a run of ten, the binomial tree ~1.1 and 1.2-2.3 ms.
A calibration timing single calls once judged the tree a clear win there, and ``auto`` then ran
0.54x native in the benchmark.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")

# A round times ITER_BYTES worth of calls back to back (at most MAX_ITERS, at least one call):
# enough to amortise the barrier's skew between ranks for small messages.
ITER_BYTES = 256 << 10
MAX_ITERS = 10


def rotated(items: list[T], round_: int) -> list[T]:
    """``items`` in round ``round_``'s order: starting at ``round_`` mod their number."""
    k = round_ % len(items) if items else 0
    return items[k:] + items[:k]


def iters_for(n_bytes: int) -> int:
    """Calls per timed round for messages of ``n_bytes``."""
    return max(1, min(MAX_ITERS, ITER_BYTES // n_bytes))
