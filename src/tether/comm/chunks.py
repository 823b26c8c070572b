"""How a flat vector of ``n`` elements is cut into ``P`` chunks, one rule for the whole package.

The first ``n % P`` chunks are one element longer (as :func:`torch.tensor_split`). Schedules
(:mod:`tether.comm.collectives.schedule`) cut vectors this way, and all-gather gives chunk ``r``
to rank ``r``, so the transports' own all-gathers (:mod:`tether.comm.transport`,
:mod:`tether.comm.mpi_transport`) must cut alike; this leaf module (torch-free, importing nothing
of Tether's) is what both sides import.
"""

from __future__ import annotations


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``chunks`` nearly equal pieces of ``n`` elements."""
    base, extra = divmod(n, chunks)
    bounds, start = [], 0
    for i in range(chunks):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
