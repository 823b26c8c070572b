"""The backend's built-in collectives (gloo on CPU, NCCL on GPU) behind the same interface.

The reference the hand-written algorithms are tested and benchmarked against. ``avg`` is a sum then a division on every backend (gloo has no AVG op). What the
backend does inside is not visible, so ``native`` has no schedule.
"""

from __future__ import annotations

import torch

from tether.comm.collectives.base import Collective
from tether.comm.collectives.schedule import Schedule
from tether.comm.transport import Transport
from tether.errors import TetherError


class Native(Collective):
    """The backend's own collectives (torch.distributed: gloo or NCCL; or MPI's)."""

    name = "native"
    kinds = ("all_reduce", "broadcast", "reduce", "all_gather")

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        raise TetherError("collective 'native' is the backend's own algorithm: no schedule")

    def execute(
        self, kind: str, flat: torch.Tensor, op: str, root: int, transport: Transport
    ) -> None:
        # avg is a sum here; Collective._run divides (gloo has no AVG op).
        reduce_op = "sum" if op == "avg" else op
        if kind == "all_reduce":
            transport.all_reduce(flat, reduce_op)
        elif kind == "reduce":
            transport.reduce(flat, root, reduce_op)
        elif kind == "all_gather":
            transport.all_gather(flat)
        else:
            transport.broadcast(flat, root)
