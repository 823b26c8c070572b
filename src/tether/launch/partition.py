"""Chip partitioning: how a node's cores are shared among its worker processes.

SC17 (You, Buluc, Demmel), co-design 5, "KNL chip partitioning": one many-core chip is run as P
parts, each a worker with its own replica and data shard and its own group of cores; more parts
means more replicas, each with less parallel work inside, and the paper measured AlexNet on one
68-core KNL reaching its target 3.3x sooner with 16 parts than with one. A *partition* here is
that choice for one node: ``workers_per_node`` processes, each with ``threads_per_worker`` intra-op
threads and, where the platform allows and the parts fit, its own disjoint group of that many
cores (``sched_setaffinity``), so the parts do not take turns on the same cores.

The whole process is pinned to its group before the process group starts, so the backend's own
threads (gloo's I/O loop) and torch's intra-op pool, created later, inherit the group and stay on
the part's cores. Nothing here reads the environment: the caller passes the launcher's counts.

The cores divided are the process's affinity mask, which is the node's share for all its parts
when one process started them all (torchrun's agent, our launcher: they bind nobody). ``srun``
and ``mpiexec`` start every rank themselves and may bind each to cores of its own (``srun
--cpus-per-task 8 --cpu-bind=cores``, ``mpiexec --bind-to core``): dividing such a mask again
among the node's ranks would leave each rank an Lth of its own cores. One process cannot see the
others' masks, but it can see that its own is no wider than the job's cores divided among the
node's ranks (:func:`mask_is_own`), which a mask shared by all of them is not; it then keeps its
whole mask.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from tether.errors import TetherError
from tether.spelling import both_ways


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask; every core where the platform has
    no masks)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Partition:
    """One node's split: ``workers_per_node`` processes of ``threads_per_worker`` threads each;
    ``core_groups[local_rank]`` the cores of each (None: not pinned, the parts share every
    core)."""

    workers_per_node: int
    threads_per_worker: int
    core_groups: tuple[tuple[int, ...], ...] | None
    # Where the launcher bound each process to cores of its own: this process's cores (its
    # mask, or the first threads_per_worker of it when pinned); the others' are not known here.
    own_cores: tuple[int, ...] | None = None

    def summary(self) -> dict[str, Any]:
        """summary.json's ``partition`` (``own_cores`` only where the launcher bound the ranks)."""
        groups = [list(g) for g in self.core_groups] if self.core_groups is not None else None
        out: dict[str, Any] = {
            "workers_per_node": self.workers_per_node,
            "threads_per_worker": self.threads_per_worker,
            "core_groups": groups,
        }
        if self.own_cores is not None:
            out["own_cores"] = list(self.own_cores)
        return out


def mask_is_own(cores: list[int], workers_per_node: int, job_cores: int) -> bool:
    """Whether ``cores``, this process's mask, is its launcher's binding of this rank alone
    rather than the cores every rank of the node shares: with several ranks on the node, it is
    no wider than an even share of the ``job_cores`` the machine gives the job
    (:func:`tether.launch.cpuset.job_core_count`). A mask shared by all the node's ranks is as
    wide as the job's cores, or wider than a share (``mpiexec --bind-to socket``, two ranks to
    a socket: divided as a shared one, so no core runs two ranks' threads)."""
    return workers_per_node > 1 and len(cores) * workers_per_node <= job_cores


def plan_partition(
    workers_per_node: int,
    threads_per_worker: int,
    pin: bool,
    cores: list[int],
    own_mask: bool = False,
) -> Partition:
    """The partition of ``cores`` among ``workers_per_node`` processes (every rank on the node,
    a parameter server included). ``threads_per_worker`` 0 divides the cores evenly (at least one
    thread each); an explicit count above one whose total exceeds the cores is refused, since
    the parts would then take turns on cores instead of running side by side (one thread each
    is the least there is: with more processes than cores it is what 0 gives too). Core groups
    are consecutive cores, given only when ``pin`` and every part gets its own. ``own_mask``:
    the launcher bound this process to ``cores`` alone (:func:`mask_is_own`), so they are not
    divided: 0 threads means one per core of the mask, and pinning keeps the first
    ``threads_per_worker`` of them."""
    workers = max(1, workers_per_node)
    if threads_per_worker < 0:
        raise TetherError(f"threads_per_worker must be >= 0, got {threads_per_worker}")
    if own_mask:
        return _own_partition(workers, threads_per_worker, pin, cores)
    threads = threads_per_worker or max(1, len(cores) // workers)
    if threads_per_worker > 1 and workers * threads > len(cores):
        raise TetherError(
            f"{workers} workers x {threads} threads need {workers * threads} cores and this "
            f"node has {len(cores)}: use "
            f"{both_ways(threads_per_worker=max(1, len(cores) // workers))} or fewer workers (0 "
            "divides the cores evenly)"
        )
    groups = None
    if pin and workers * threads <= len(cores):
        groups = tuple(tuple(cores[i * threads : (i + 1) * threads]) for i in range(workers))
    return Partition(workers, threads, groups)


def _own_partition(workers: int, threads_per_worker: int, pin: bool, cores: list[int]) -> Partition:
    """A process bound to ``cores`` by its launcher: they are all its own."""
    threads = threads_per_worker or len(cores)
    if threads > len(cores):
        raise TetherError(
            f"{threads} threads per worker need {threads} cores and the launcher bound this "
            f"process to {len(cores)}: use {both_ways(threads_per_worker=len(cores))} or fewer, "
            "or bind each task to more cores (srun --cpus-per-task)"
        )
    own = tuple(cores[:threads]) if pin else tuple(cores)
    return Partition(workers, threads, None, own)


def apply_partition(partition: Partition, local_rank: int) -> tuple[int, ...] | None:
    """Give this process its threads and (if the partition pins) its cores; returns the cores.
    Called before the process group and before torch's first parallel region, so the threads
    created afterwards inherit the mask."""
    torch.set_num_threads(partition.threads_per_worker)
    if not hasattr(os, "sched_setaffinity"):
        return None
    if partition.own_cores is not None:
        group = partition.own_cores
    elif partition.core_groups is not None:
        group = partition.core_groups[local_rank % partition.workers_per_node]
    else:
        return None
    os.sched_setaffinity(0, group)
    return group
