"""``auto``: per message size, the algorithm a calibration of the running group found fastest.

The choice MPICH and NCCL make with fixed thresholds (Thakur, Rabenseifner and Gropp 2005:
recursive doubling for short messages, Rabenseifner's or the ring for long ones), made here from
a calibration of the running transport (:mod:`tether.comm.calibration`): every candidate,
``native`` included, timed at a few sizes (the alpha-beta-gamma model where nothing was timed),
and ``native`` kept unless another is clearly faster. Every rank holds rank 0's calibration, so
every rank picks the same algorithm for the same size.

The calibration is given, never fetched: measuring one is a collective of tens of seconds that
needs to know where caches live and how ranks are placed, which is the caller's business, and
the calibration itself runs these collectives. The instance registered under "auto" has none,
and says so when it is run; callers that resolve "auto" by name build a calibrated one.
"""

from __future__ import annotations

import sys
from typing import Protocol

import torch

from tether.comm.collectives.base import Collective
from tether.comm.collectives.schedule import Schedule
from tether.comm.transport import Transport
from tether.errors import TetherError

UNCALIBRATED = (
    "collective 'auto' needs a calibration of the running group: build it as "
    "Auto(load_or_calibrate(transport, cache_dir, ranks_per_node)) "
    "(tether.comm.calibration.cache), or use AllReducer(transport, 'auto', ...), which does"
)


class Choices(Protocol):
    """What ``auto`` needs of a calibration
    (:class:`tether.comm.calibration.model.Calibration`)."""

    @property
    def world_size(self) -> int: ...

    def choose(self, kind: str, n_bytes: float) -> str: ...

    def instantiate(self, algorithm: str) -> Collective: ...


class Auto(Collective):
    """Per message size, the algorithm the calibration of the running group found fastest."""

    name = "auto"
    kinds = ("all_reduce", "broadcast", "all_gather")

    def __init__(self, calibration: Choices | None = None) -> None:
        self.calibration = calibration
        self._choices: dict[tuple[str, int], Collective] = {}
        self._said: set[tuple[str, str]] = set()  # (kind, algorithm) rank 0 has named

    def calibrated(self, transport: Transport) -> Choices:
        """The calibration, checked against ``transport``'s group: a one-line error where there
        is none, or it was measured on a group of another size."""
        calibration = self.calibration
        if calibration is None:
            raise TetherError(UNCALIBRATED)
        if calibration.world_size != transport.world_size:
            raise TetherError(
                f"collective 'auto' was calibrated on {calibration.world_size} ranks and runs on "
                f"a group of {transport.world_size}: calibrate it on the group it runs on"
            )
        return calibration

    def choose(self, kind: str, n_bytes: int, transport: Transport) -> Collective:
        calibration = self.calibrated(transport)
        key = (kind, n_bytes)
        if key not in self._choices:
            # with the parameters the calibration priced (chain chunks, node size)
            algorithm = calibration.choose(kind, n_bytes)
            self._choices[key] = calibration.instantiate(algorithm)
            if transport.rank == 0 and (kind, algorithm) not in self._said:
                # once an algorithm: the user asked for auto and sees what it does
                self._said.add((kind, algorithm))
                print(
                    f"tether: auto {kind.replace('_', '-')}: {algorithm} for messages of "
                    f"{_size(n_bytes)} (the fastest the group's calibration timed there)",
                    file=sys.stderr,
                    flush=True,
                )
        return self._choices[key]

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        raise TetherError("collective 'auto' picks an algorithm per call: no fixed schedule")

    def execute(
        self, kind: str, flat: torch.Tensor, op: str, root: int, transport: Transport
    ) -> None:
        chosen = self.choose(kind, flat.numel() * flat.element_size(), transport)
        chosen.execute(kind, flat, op, root, transport)


def _size(n_bytes: float) -> str:
    """``64 KiB``, ``1.2 MiB``."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} B"
