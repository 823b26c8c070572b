"""The parameter server's message wire, timed for ``tether calibrate``.

One exchange of the server methods (You, Buluc, Demmel, SC17, section 4) is a worker's message
of the flat parameter vector to the server and the server's reply of the same size, on the
header-checked socket wire the methods use (:mod:`tether.comm.socket_wire`). Two local ranks time
round trips at several sizes; the fit of ``t = 2(a + n*b)`` gives the profile's ``server_wire``
link, which prices those messages (:func:`tether.perf.collective_cost.message_time`) instead of
the collective link fitted to gloo's all-reduce: a point-to-point message on its own TCP
connection does not pay a collective round's costs (benchmarks/results/ps_wire_*.md).
"""

from __future__ import annotations

import datetime
import statistics
import time
from dataclasses import dataclass

import torch

from tether.bench.link_fit import fit_alpha_beta
from tether.comm.header import MessageKind
from tether.comm.messages import MessageProtocol
from tether.comm.transport import TorchTransport
from tether.comm.wire_setup import open_socket_wire
from tether.launch.spawn import run_spawned

WIRE_SIZES = (1024, 16_384, 65_536, 262_144, 1_048_576)  # floats: 4 KB to 4 MB
LOOPBACK = "127.0.0.1"
WARM = 5  # untimed round trips before the timed ones


def round_trips(wire: MessageProtocol, n: int, exchanges: int) -> list[float]:
    """Time ``exchanges`` worker -> server -> worker exchanges of ``n`` floats (rank 1 the
    worker, rank 0 the server, which echoes; the worker's list, the server's is empty)."""
    buffer = torch.zeros(n)
    payload = torch.ones(n)
    times = []
    for i in range(exchanges + WARM):  # untimed first: connections and buffers warm
        if wire.rank == 0:
            msg = wire.recv_message(buffer, src=1)
            wire.send_message(msg.payload, 1, MessageKind.PARAMS, msg.header.step)
            continue
        start = time.perf_counter()
        wire.send_message(payload, 0, MessageKind.GRADIENT, step=i)
        wire.recv_message(buffer, src=0)
        if i >= WARM:
            times.append(time.perf_counter() - start)
    return times


def _time_wire(rank: int, world: int, sizes: tuple[int, ...], exchanges: int) -> dict[int, float]:
    """One rank of the timing: the median round trip per size (the worker's; the server's is
    empty)."""
    torch.set_num_threads(1)
    gloo = TorchTransport()

    def scatter(tensor: torch.Tensor, parts: list[torch.Tensor] | None) -> None:
        gloo.scatter(tensor, parts, 0)

    wire = open_socket_wire(scatter, rank, world, 30.0, LOOPBACK)
    medians = {}
    try:
        for n in sizes:
            gloo.barrier()
            times = round_trips(wire, n, exchanges)
            if times:
                medians[n] = statistics.median(times)
    finally:
        wire.close()
    return medians


@dataclass(frozen=True)
class WireFit:
    alpha: float  # seconds per message
    beta: float  # seconds per byte
    points: list[tuple[float, float]]  # (bytes, round-trip seconds)
    when: str


def measure_server_wire(timeout_s: float, exchanges: int = 50) -> WireFit:
    """Time the socket wire's round trips on two local ranks and fit ``t = 2(a + n*b)``."""
    medians = run_spawned(_time_wire, 2, WIRE_SIZES, exchanges, timeout_s=timeout_s)[1]
    points = [(4.0 * n, seconds) for n, seconds in sorted(medians.items())]
    alpha, beta = fit_alpha_beta(points, messages=2, bytes_factor=2)
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return WireFit(alpha, beta, points, when)
