"""Peak memory of many local workers: each with its own copy of the data set, or one shared copy.

Runs ``tether train --workers P`` (LeNet-5 / Fashion-MNIST, sync-sgd, a few steps) with the data
cache off (``TETHER_DATA_CACHE=off``: every worker reads and normalizes the files into its own
memory, as before the cache) and on (every worker maps the one cached copy, filled by the
launcher), alternating, and samples while each run goes:

- the machine's memory in use (``MemTotal - MemAvailable`` from ``/proc/meminfo``) above what it
  was before the run: what the run costs the machine, shared pages counted once;
- the sum of the run's processes' proportional set sizes (``Pss`` from ``smaps_rollup``): the
  same, from the processes' side.

Both are reported at their peak over the run, with the spread over the rounds.

Run from the repository root::

    .venv/bin/python benchmarks/bench_memory.py                  # 16 workers, 2 rounds: ~6 min
    .venv/bin/python benchmarks/bench_memory.py --workers 4 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from _common import ForeignLoad, machine, process_tree, tether_command, write_part_result

GIB = 1024**3


def used_bytes() -> int:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def tree_pss(root: int) -> int:
    """Sum of Pss over ``root`` and its descendants."""
    total = 0
    for pid in process_tree(root, ForeignLoad.snapshot()):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def measure(workers: int, steps: int, shared: bool, cache: Path) -> dict[str, Any]:
    """One run; its peak machine memory above the baseline and peak summed Pss."""
    env = {**os.environ, "TETHER_DATA_CACHE": str(cache) if shared else "off"}
    with tempfile.TemporaryDirectory() as out:
        argv = [
            *tether_command(), "train", "--method", "sync-sgd", "--workers", str(workers),
            "--steps", str(steps), "--eval-every", str(steps), "--out", out, "--overwrite",
            "--no-progress",
        ]  # fmt: skip
        time.sleep(2)  # let the previous run's memory go back
        baseline = used_bytes()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        peak = {"used": 0, "pss": 0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.25):
                peak["used"] = max(peak["used"], used_bytes() - baseline)
                peak["pss"] = max(peak["pss"], tree_pss(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        start = time.perf_counter()
        sampler.start()
        _, stderr = proc.communicate(timeout=900)
        stop.set()
        sampler.join()
        if proc.returncode != 0:
            raise SystemExit(f"run failed: {stderr.decode()[-500:]}")
    return {**peak, "wall_s": time.perf_counter() - start}


def spread(values: list[float]) -> str:
    mean = sum(values) / len(values)
    return f"{mean:.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    info, started = machine(), time.perf_counter()
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as cache:
        for r in range(args.rounds):
            for shared in (False, True):
                result = measure(args.workers, args.steps, shared, Path(cache))
                runs[shared].append(result)
                print(f"round {r + 1} {'shared' if shared else 'own copies'}: "
                      f"machine +{result['used'] / GIB:.2f} GiB, Pss {result['pss'] / GIB:.2f} "
                      f"GiB, {result['wall_s']:.0f} s", flush=True)  # fmt: skip
    own = [r["used"] / GIB for r in runs[False]]
    mapped = [r["used"] / GIB for r in runs[True]]
    own_pss = [r["pss"] / GIB for r in runs[False]]
    mapped_pss = [r["pss"] / GIB for r in runs[True]]
    ratio = [a / b for a, b in zip(own, mapped, strict=True)]
    lines = [
        f"`tether train --method sync-sgd --workers {args.workers} --steps {args.steps}` "
        f"(LeNet-5, Fashion-MNIST), {args.rounds} rounds, the two settings alternating. Peak over "
        "each run, mean (min-max) over the rounds.",
        "",
        "| data | machine memory in use, above before the run (GiB) | sum of the processes' Pss "
        "(GiB) | wall (s) |",
        "|---|---:|---:|---:|",
        f"| every worker its own copy (`TETHER_DATA_CACHE=off`) | {spread(own)} "
        f"| {spread(own_pss)} | {spread([r['wall_s'] for r in runs[False]])} |",
        f"| one shared, mapped copy (the default) | {spread(mapped)} | {spread(mapped_pss)} "
        f"| {spread([r['wall_s'] for r in runs[True]])} |",
        "",
        f"Own copies / shared: {spread(ratio)}x the machine memory.",
    ]
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = ["own copies", "shared copy"]
    ax.bar(labels, [sum(own) / len(own), sum(mapped) / len(mapped)], color=["gray", "tab:blue"])
    for i, values in enumerate((own, mapped)):
        ax.scatter([i] * len(values), values, color="black", zorder=3, s=12)
    ax.set_ylabel("peak machine memory of the run (GiB)")
    ax.set_title(f"{args.workers} local workers, LeNet-5 / Fashion-MNIST")
    fig.tight_layout()
    write_part_result(
        f"Peak memory of {args.workers} local workers: own data copies vs one shared copy",
        "memory_workers", lines, fig, info, started,
    )  # fmt: skip


if __name__ == "__main__":
    main()
