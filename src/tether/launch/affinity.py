"""Pinning a rank's main thread to one core, as MPI benchmarks bind ranks to cores.

Only the calling thread is pinned (``sched_setaffinity`` of thread id 0), after the process
group is up: the backend's own threads (gloo's I/O loop, MPI's progress) keep every core. What
it does on the 2-core test machine (2 ranks, 300 gloo all-reduces of 16 KiB): 90th percentile
4.1 ms unpinned, 1.6 ms with the main threads pinned, 3.5 ms with the whole process pinned (the
main and I/O threads then queue for one core). It is not the default of ``tether bench comm``:
in the same runs our point-to-point algorithms lost more to native pinned than unpinned (ring at
4 KiB 0.27x native pinned, 0.69x unpinned), so pinning changes the comparison, not only the noise.
"""

from __future__ import annotations

import os

from tether.launch.partition import usable_cores

_pinned_core: int | None = None


def pinned_core() -> int | None:
    """The core :func:`pin_main_thread` pinned this process's main thread to (None: not pinned).
    Timings taken pinned differ from unpinned ones (above), so calibrations are kept apart."""
    return _pinned_core


def pin_main_thread(local_rank: int) -> int | None:
    """Pin the calling thread to core ``local_rank`` mod the cores this process may use, and
    return that core (None where the platform cannot pin: not Linux)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = usable_cores()
    core = cores[local_rank % len(cores)]
    os.sched_setaffinity(0, {core})
    global _pinned_core
    _pinned_core = core
    return core
