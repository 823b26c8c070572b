"""The order in which interleaved timing rounds run the algorithms they compare.

``tether bench comm`` and the calibration time several algorithms side by side: round 1 of every
algorithm, then round 2, ... so that a slow spell of the machine hits them alike. A fixed order
within the rounds leaves a position effect: on 2 ranks of the 2-core test machine, native timed
last in each round ran 0.71x-0.87x native timed first (the same code). Rotating the order, each
round starting one further along, puts every algorithm in every position equally often.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def rotated(items: list[T], round_: int) -> list[T]:
    """``items`` in round ``round_``'s order: starting at ``round_`` mod their number."""
    k = round_ % len(items) if items else 0
    return items[k:] + items[:k]
