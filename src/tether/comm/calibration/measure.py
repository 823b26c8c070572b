"""Measuring a calibration on the running group: the links' alpha and beta by ping-pong through
``exchange`` (within a node, and between two nodes where there are several), gamma by an
in-place add, the CPUs the ranks of a one-node group run on (where those CPUs move the bytes:
every backend but NCCL), then every candidate algorithm timed side by side
(:mod:`tether.comm.calibration.timed_algorithms`).

Collective: every rank calls :func:`calibrate` at the same point; rank 0's numbers reach every
rank, so every rank builds the same :class:`~tether.comm.calibration.model.Calibration`.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import UTC, datetime

import torch

from tether.comm.calibration.model import Calibration
from tether.comm.calibration.timed_algorithms import time_algorithms
from tether.comm.collectives.auto import Auto
from tether.comm.transport import Transport

CALIBRATION_TAG = 7900
PING_SIZES = (4, 256 << 10, 4 << 20)
KINDS = Auto.kinds  # what auto picks for, so what is timed


def _one_way_time(transport: Transport, a: int, b: int, n_bytes: int, reps: int) -> float:
    """Half the round trip of ``n_bytes`` between ranks a and b (other ranks return 0)."""
    buf = torch.zeros(max(1, n_bytes // 4), dtype=torch.float32)
    rank = transport.rank
    if rank not in (a, b):
        return 0.0
    peer = b if rank == a else a
    for i in range(reps + 1):  # the first round trip warms the connection up, untimed
        if i == 1:
            start = time.perf_counter()
        if rank == a:
            transport.exchange([(buf, peer)], [], CALIBRATION_TAG)
            transport.exchange([], [(buf, peer)], CALIBRATION_TAG)
        else:
            transport.exchange([], [(buf, peer)], CALIBRATION_TAG)
            transport.exchange([(buf, peer)], [], CALIBRATION_TAG)
    return (time.perf_counter() - start) / (2 * reps)


def _link(transport: Transport, a: int, b: int) -> tuple[float, float]:
    """(alpha, beta) of the link between ranks a and b, measured on rank a."""
    times = [_one_way_time(transport, a, b, n, 30 if n < 1024 else 5) for n in PING_SIZES]
    alpha = times[0]
    slope = (times[2] - times[1]) / (PING_SIZES[2] - PING_SIZES[1])
    # On a busy machine the smaller transfer can take longer than the larger one; the time per
    # byte of the larger alone (an upper bound) is then a better estimate than a slope of <= 0.
    beta = slope if slope > 0 else times[2] / PING_SIZES[2]
    return alpha, beta


def measure_gamma() -> float:
    """Seconds per byte of an in-place float32 add (the reduction's gamma), on this process's
    threads."""
    x, y = torch.ones(1 << 20), torch.ones(1 << 20)  # 4 MiB of float32
    x.add_(y)
    start = time.perf_counter()
    for _ in range(5):
        x.add_(y)
    return (time.perf_counter() - start) / (5 * x.numel() * 4)


def _affinity() -> set[int]:
    """The CPUs this process may run on (every CPU where the platform has no affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def node_cores(transport: Transport) -> int:
    """How many CPUs the group's ranks may run on together: the union of their affinities
    (collective; one node). Pinned ranks count their own cores, unpinned ones the node's."""
    mine = _affinity()
    width = max(os.cpu_count() or 1, *mine) + 1
    mask = torch.zeros(width, dtype=torch.float64)
    mask[sorted(mine)] = 1.0
    transport.all_reduce(mask, op="max")
    return int(mask.sum())


def calibrate(transport: Transport, ranks_per_node: int, backend: str = "") -> Calibration:
    """Measure alpha, beta, gamma (and the inter-node alpha, beta) and time the algorithms.
    Collective: every rank calls it; every rank returns rank 0's numbers."""
    world = transport.world_size
    values = torch.zeros(5, dtype=torch.float64)
    if world >= 2:
        alpha, beta = _link(transport, 0, 1)
        inter_alpha, inter_beta = alpha, beta
        if ranks_per_node < world:
            inter_alpha, inter_beta = _link(transport, 0, ranks_per_node)
        values = torch.tensor(
            [alpha, beta, measure_gamma(), inter_alpha, inter_beta], dtype=torch.float64
        )
        transport.broadcast(values, 0)
    a, b, g, ia, ib = (float(v) for v in values)
    # NCCL moves GPU memory over its own links; every other backend copies through the CPUs
    shared = world >= 2 and ranks_per_node >= world and backend != "nccl"
    cores = node_cores(transport) if shared else 0
    measured, clear_wins = {}, {}
    if world >= 2:
        for kind in KINDS:
            measured[kind], clear_wins[kind] = time_algorithms(
                transport, kind, a, b, ranks_per_node
            )
    return Calibration(
        world_size=world,
        ranks_per_node=ranks_per_node,
        alpha=a,
        beta=b,
        gamma=g,
        inter_alpha=ia,
        inter_beta=ib,
        cores=cores,
        measured=measured,
        clear_wins=clear_wins,
        backend=backend,
        host=socket.gethostname(),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
