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
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from tether.errors import TetherError


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

    def summary(self) -> dict[str, Any]:
        """summary.json's ``partition``."""
        groups = [list(g) for g in self.core_groups] if self.core_groups is not None else None
        return {
            "workers_per_node": self.workers_per_node,
            "threads_per_worker": self.threads_per_worker,
            "core_groups": groups,
        }


def plan_partition(
    workers_per_node: int, threads_per_worker: int, pin: bool, cores: list[int]
) -> Partition:
    """The partition of ``cores`` among ``workers_per_node`` processes (every rank on the node,
    a parameter server included). ``threads_per_worker`` 0 divides the cores evenly (at least one
    thread each); an explicit count above one whose total exceeds the cores is refused, since
    the parts would then take turns on cores instead of running side by side (one thread each
    is the least there is: with more processes than cores it is what 0 gives too). Core groups
    are consecutive cores, given only when ``pin`` and every part gets its own."""
    workers = max(1, workers_per_node)
    if threads_per_worker < 0:
        raise TetherError(f"threads_per_worker must be >= 0, got {threads_per_worker}")
    threads = threads_per_worker or max(1, len(cores) // workers)
    if threads_per_worker > 1 and workers * threads > len(cores):
        raise TetherError(
            f"{workers} workers x {threads} threads need {workers * threads} cores and this "
            f"node has {len(cores)}: use --threads-per-worker {max(1, len(cores) // workers)} "
            "or fewer workers (0 divides the cores evenly)"
        )
    groups = None
    if pin and workers * threads <= len(cores):
        groups = tuple(tuple(cores[i * threads : (i + 1) * threads]) for i in range(workers))
    return Partition(workers, threads, groups)


def apply_partition(partition: Partition, local_rank: int) -> tuple[int, ...] | None:
    """Give this process its threads and (if the partition pins) its cores; returns the cores.
    Called before the process group and before torch's first parallel region, so the threads
    created afterwards inherit the mask."""
    torch.set_num_threads(partition.threads_per_worker)
    if partition.core_groups is None or not hasattr(os, "sched_setaffinity"):
        return None
    group = partition.core_groups[local_rank % partition.workers_per_node]
    os.sched_setaffinity(0, group)
    return group
