"""The backend's built-in collectives (gloo on CPU, NCCL on GPU) behind the same interface.

The reference the hand-written algorithms are tested and benchmarked against (DESIGN.md
convention 4). ``avg`` is a sum then a division on every backend (gloo has no AVG op). What the
backend does inside is not visible, so ``native`` has no schedule.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tether.comm.collectives.base import Collective
from tether.comm.collectives.schedule import Schedule
from tether.errors import TetherError

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


class Native(Collective):
    """The backend's own all_reduce, broadcast and reduce (torch.distributed)."""

    name = "native"
    kinds = ("all_reduce", "broadcast", "reduce")

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        raise TetherError("collective 'native' is the backend's own algorithm: no schedule")

    def execute(
        self, kind: str, flat: torch.Tensor, op: str, root: int, group: dist.ProcessGroup | None
    ) -> None:
        if kind == "all_reduce":
            dist.all_reduce(flat, op=_OPS[op], group=group)
        elif kind == "reduce":
            dist.reduce(flat, op=_OPS[op], group=group, group_dst=root)
        else:
            dist.broadcast(flat, group=group, group_src=root)
