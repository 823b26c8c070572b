"""The conventions every part of ``tether bench comm`` shares: the operations and their root,
the size units, nccl-tests' bandwidth arithmetic, and the launchers' backstop.

A leaf: the argument model (:mod:`tether.bench.comm`), the measurement, the report and the
launchers all import it, and it imports none of them.
"""

from __future__ import annotations

# The --op names (nccl-tests spelling) and the collective kinds of tether.comm.collectives.
OPS = {
    "allreduce": "all_reduce",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "allgather": "all_gather",
}
ROOT = 0  # source of broadcast, destination of reduce
ELEMENT_BYTES = 4  # float32, as nccl-tests' default data type
UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
GB = 1e9  # nccl-tests' GB/s are 1e9 bytes per second
# torch's collective timeout and the MPI launcher's deadline exceed the ranks' own deadline by
# this much, so the deadline fires first on every rank and leaves every rank's stacks.
BACKSTOP_S = 30.0


def format_size(n_bytes: int) -> str:
    """The largest unit that divides ``n_bytes`` exactly, in --sizes syntax (``"64MB"``)."""
    for unit in ("GB", "MB", "KB"):
        if n_bytes >= UNITS[unit] and n_bytes % UNITS[unit] == 0:
            return f"{n_bytes // UNITS[unit]}{unit}"
    return f"{n_bytes}B"


def busbw_factor(kind: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor: what each rank's link carries in an optimal algorithm
    divided by the message size (PERFORMANCE.md)."""
    p = world_size
    if kind == "all_reduce":
        return 2 * (p - 1) / p
    if kind in ("all_gather", "reduce_scatter"):
        return (p - 1) / p
    if kind in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"no bus bandwidth factor for {kind!r}")
