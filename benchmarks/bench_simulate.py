"""How long ``tether simulate`` takes at its largest advertised size: 4096 simulated workers x
1000 rounds of every simulated method, with equal workers and with heterogeneous ones
(lognormal speeds, jitter and 1% stragglers 5 times slower), ``--repeats`` times each,
interleaved; reports the median and range of each cell's wall time and a bar chart.

The simulation alone (``tether.perf.simulate``), not the command's start-up (importing torch
and writing the plot). Run from the repository root::

    .venv/bin/python benchmarks/bench_simulate.py               # 3 repeats: about a minute
"""

from __future__ import annotations

import argparse
import statistics
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from _common import ForeignLoad, machine, write_part_result
from tether.perf.simulator import SIMULATED_METHODS, SimulationConfig, WorkerSpeeds, simulate

WORKERS, ROUNDS = 4096, 1000
SPEEDS = {
    "equal": WorkerSpeeds(1e-2),
    "mixed": WorkerSpeeds(
        1e-2, heterogeneity=0.3, jitter=0.3, straggler_probability=0.01, straggler_slowdown=5
    ),
}


def measure(repeats: int, times: dict[tuple[str, str], list[float]]) -> None:
    for _ in range(repeats):  # interleaved: a burst of other load hits every cell alike
        for speeds_name, speeds in SPEEDS.items():
            for method in SIMULATED_METHODS:
                config = SimulationConfig(
                    method, WORKERS, ROUNDS, speeds, message_s=1e-4, service_s=5e-6, tau=4
                )
                start = time.perf_counter()
                simulate(config)
                times.setdefault((method, speeds_name), []).append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    info, started = machine(), time.perf_counter()
    times: dict[tuple[str, str], list[float]] = {}
    with ForeignLoad() as load:
        measure(args.repeats, times)
    lines = [
        f"{WORKERS} simulated workers x {ROUNDS} rounds, the simulation alone, {args.repeats} "
        f"interleaved repeats; other load: {load.cores():.2f} cores busy on average "
        f"({load.top()})",
        "",
        "| method | workers | median (s) | range (s) |",
        "|---|---|---:|---:|",
    ]
    for (method, speeds_name), values in times.items():
        lines.append(
            f"| {method} | {speeds_name} | {statistics.median(values):.2f} | "
            f"{min(values):.2f}-{max(values):.2f} |"
        )
    every = [v for values in times.values() for v in values]
    lines += ["", f"All cells: {min(every):.2f}-{max(every):.2f} s."]
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{m}\n{s}" for m, s in times]
    ax.bar(range(len(times)), [statistics.median(v) for v in times.values()])
    ax.set_xticks(range(len(times)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("wall time (s, median)")
    ax.set_title(f"tether simulate: {WORKERS} workers x {ROUNDS} rounds")
    fig.tight_layout()
    write_part_result(
        f"Simulator speed: {WORKERS} workers x {ROUNDS} rounds",
        "simulate_speed",
        lines,
        fig,
        info,
        started,
    )


if __name__ == "__main__":
    main()
