"""The parameter server's message wire: our socket wire against gloo's point-to-point.

One exchange of the asynchronous methods (You, Buluc, Demmel, SC17, section 4) is a worker's
message of the flat parameter vector to the server and the server's reply of the same size.
Both go through the same header-checked protocol (tether.comm.messages); the transport under it
is either gloo's isend/irecv on the process group (what the server methods used before) or the
socket wire (tether.comm.socket_wire: one TCP connection per worker and channel). Two ranks,
one spawned group, the two wires interleaved over ``--repeats`` rounds; per round and size the
median of ``--exchanges`` timed round trips, and the ratio socket / gloo with its spread over
the rounds.

    .venv/bin/python benchmarks/bench_ps_wire.py        # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from _common import machine, write_part_result
from tether.bench.server_wire import LOOPBACK, round_trips
from tether.comm.messages import MessageProtocol
from tether.comm.transport import TorchTransport
from tether.comm.wire_setup import open_socket_wire
from tether.launch.spawn import run_spawned

# Floats per message: LeNet-5 (61,706 parameters), then 1M and 4M (4 and 16 MB).
SIZES = [61_706, 1 << 20, 1 << 22]


def _run(rank: int, world: int, repeats: int, exchanges: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    gloo = TorchTransport()

    def gloo_scatter(tensor: torch.Tensor, parts: list[torch.Tensor] | None) -> None:
        gloo.scatter(tensor, parts, 0)

    wires: dict[str, MessageProtocol] = {
        "gloo": gloo,
        "socket": open_socket_wire(gloo_scatter, rank, world, 30.0, LOOPBACK),
    }
    medians: dict[str, dict[int, list[float]]] = {name: {n: [] for n in SIZES} for name in wires}
    for _ in range(repeats):
        for n in SIZES:
            for name, wire in wires.items():
                gloo.barrier()
                times = round_trips(wire, n, exchanges)
                if times:
                    medians[name][n].append(statistics.median(times))
    return {"medians": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--exchanges", type=int, default=20)
    args = parser.parse_args()
    started = time.perf_counter()
    info = machine()
    result = run_spawned(_run, 2, args.repeats, args.exchanges, timeout_s=600)[1]
    medians = result["medians"]
    lines = [
        f"Two ranks (server and one worker) on this machine, loopback; {args.repeats} rounds, "
        f"each the median of {args.exchanges} round trips per wire and size, the wires "
        "interleaved. Ratio: socket / gloo per round (below 1: the socket wire is faster).",
        "",
        "| floats | MB | gloo ms (median of rounds) | socket ms | ratio median | ratio min-max |",
        "|---|---|---|---|---|---|",
    ]
    figure = Figure(figsize=(6, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for name in ("gloo", "socket"):
        axes.plot(
            [n * 4 / 1e6 for n in SIZES],
            [statistics.median(medians[name][n]) * 1e3 for n in SIZES],
            marker="o",
            label=name,
        )
    for n in SIZES:
        gloo, sock = medians["gloo"][n], medians["socket"][n]
        ratios = [s / g for s, g in zip(sock, gloo, strict=True)]
        lines.append(
            f"| {n} | {n * 4 / 1e6:.2f} | {statistics.median(gloo) * 1e3:.2f} | "
            f"{statistics.median(sock) * 1e3:.2f} | {statistics.median(ratios):.2f} | "
            f"{min(ratios):.2f}-{max(ratios):.2f} |"
        )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("message size (MB, each way)")
    axes.set_ylabel("round trip (ms, median)")
    axes.set_title("parameter-server exchange: gloo point-to-point vs socket wire")
    axes.legend()
    write_part_result(
        "Parameter-server wire: socket connections vs gloo point-to-point",
        "ps_wire",
        lines,
        figure,
        info,
        started,
    )


if __name__ == "__main__":
    main()
