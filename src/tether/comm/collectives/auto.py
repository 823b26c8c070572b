"""``auto``: per message size, the algorithm a calibration of the running group found fastest.

The choice MPICH and NCCL make with fixed thresholds (Thakur, Rabenseifner and Gropp 2005:
recursive doubling for short messages, Rabenseifner's or the ring for long ones), made here from
a calibration of the running transport (:mod:`tether.perf.calibration`): every candidate,
``native`` included, timed at a few sizes (the alpha-beta-gamma model where nothing was timed),
and ``native`` kept unless another is clearly faster. Every rank holds rank 0's calibration, so
every rank picks the same algorithm for the same size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tether.comm.collectives.base import Collective
from tether.comm.collectives.schedule import Schedule
from tether.comm.transport import Transport
from tether.errors import TetherError

if TYPE_CHECKING:
    from tether.perf.calibration import Calibration


class Auto(Collective):
    """Per message size, the algorithm the calibration of the running group found fastest.

    The calibration is measured and cached on first use when none is given."""

    name = "auto"
    kinds = ("all_reduce", "broadcast", "all_gather")

    def __init__(self, calibration: Calibration | None = None) -> None:
        self.calibration = calibration
        self._choices: dict[tuple[str, int], Collective] = {}

    def calibrated(self, transport: Transport) -> Calibration:
        """The calibration for ``transport``'s group; collective the first time (every rank
        reaches its first ``auto`` call at the same point of the program)."""
        if self.calibration is None or self.calibration.world_size != transport.world_size:
            from tether.perf.calibration import load_or_calibrate

            self.calibration = load_or_calibrate(transport)
            self._choices.clear()
        return self.calibration

    def choose(self, kind: str, n_bytes: int, transport: Transport) -> Collective:
        calibration = self.calibrated(transport)
        key = (kind, n_bytes)
        if key not in self._choices:
            # with the parameters the calibration priced (chain chunks, node size)
            self._choices[key] = calibration.instantiate(calibration.choose(kind, n_bytes))
        return self._choices[key]

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        raise TetherError("collective 'auto' picks an algorithm per call: no fixed schedule")

    def execute(
        self, kind: str, flat: torch.Tensor, op: str, root: int, transport: Transport
    ) -> None:
        chosen = self.choose(kind, flat.numel() * flat.element_size(), transport)
        chosen.execute(kind, flat, op, root, transport)
