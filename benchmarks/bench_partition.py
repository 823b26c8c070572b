"""Chip partitioning and the two-level EASGD of SC17's KNL design, measured on this machine.

Part ``partitions`` (the KNL experiment in miniature). One node's cores run either one worker with
all of them as intra-op threads or several single-threaded workers (each pinned to its own core,
and once unpinned), at the same global batch, data, seed and learning rate: sync-sgd, whose
update at a given global batch does not depend on the worker count, so only the time differs.
LeNet-5 and the 4.8M-parameter CNN on Fashion-MNIST, through ``tether train``; the partitions take
turns (``--repeats`` rounds, the order rotated). Reported per cell: training time per epoch
(evaluation excluded), time to 85% test accuracy, final accuracy, median and range.

Part ``nodes`` (root: network namespaces). Two emulated nodes of two ranks each, every node's link
capped at ``--link-mbit`` (tc tbf), one torchrun per node as on a real cluster:
two-level-easgd (gradients summed inside a node, elastic rounds across) against flat sync-sgd and
flat sync-easgd, each with its defaults, LeNet-5 to 85% (stopping there). Reported: time to 85%
(start-up excluded), steps, and the bytes that crossed the links per step (the switch ports'
receive counters over the whole run, start-up and evaluation included, divided by the steps).

    .venv/bin/python benchmarks/bench_partition.py --part partitions   # ~25 min on 2 cores
    .venv/bin/python benchmarks/bench_partition.py --part nodes        # ~6 min, root
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from _common import machine, tether_command, write_part_result
from tether.launch.netns import EmulatedCluster, available
from tether.launch.netns_torchrun import torchrun_across
from tether.launch.partition import usable_cores

TARGET = 0.85
GLOBAL_BATCH = 128


def parse_partition(name: str, cores: int) -> tuple[int, int, bool]:
    """``"WxT"`` (W workers of T threads, pinned) or ``"WxT-unpinned"``."""
    shape, _, flag = name.partition("-")
    workers, threads = (int(v) for v in shape.split("x"))
    if workers * threads > cores:
        raise SystemExit(f"partition {name} needs {workers * threads} cores; this node has {cores}")
    return workers, threads, flag != "unpinned"


# Runs a command and prints the peak resident memory of the largest process under it (every
# descendant is waited for by its parent, so RUSAGE_CHILDREN's maximum covers the workers).
PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(code)\n"
)


def run_train(options: list[str], out: Path) -> dict[str, Any]:
    command = [*tether_command(), "train", *options, "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *command], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    peak_mib = int(proc.stdout.strip().splitlines()[-1]) / 1024  # Linux reports KiB
    summary = json.loads((out / "summary.json").read_text())
    training_s = summary["history"][-1]["time_s"]
    return {
        "epoch_s": training_s / summary["epochs"],
        "time_to_target_s": summary["time_to_target_s"],
        "accuracy": summary["final_metrics"]["accuracy"],
        "partition": summary["partition"],
        "steps": summary["steps"],
        "peak_mib": peak_mib,
    }


def spread(values: list[float], unit: str = " s") -> str:
    if not values:
        return "not reached"
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.1f}{unit}"
    return f"{median:.1f}{unit} ({min(values):.1f}-{max(values):.1f})"


def part_partitions(args: argparse.Namespace, scratch: Path) -> tuple[list[str], Figure]:
    cores = len(usable_cores())
    # model -> (epochs, evaluation period, partitions): the CNN takes ~0.4 s a step here
    models = {
        "lenet5": (args.lenet_epochs, 60, args.partitions.split(",")),
        "cnn": (args.cnn_epochs, 117, args.cnn_partitions.split(",")),
    }
    shapes = {n: parse_partition(n, cores) for *_, names in models.values() for n in names}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        for model, (epochs, eval_every, names) in models.items():
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                workers, threads, pin = shapes[name]
                options = [
                    "--method", "sync-sgd", "--model", model, "--workers", str(workers),
                    "--threads-per-worker", str(threads), "--batch-size",
                    str(GLOBAL_BATCH // workers), "--lr", str(args.lr), "--epochs", str(epochs),
                    "--target-accuracy", str(TARGET), "--seed", "0",
                    "--eval-every", str(eval_every),
                ] + ([] if pin else ["--no-pin-workers"])  # fmt: skip
                record = run_train(options, scratch / f"{model}-{name}-{r}")
                runs.setdefault((model, name), []).append(record)
                print(f"  round {r} {model} {name}: {record}", flush=True)
    lines = [
        f"Global batch {GLOBAL_BATCH}, sync-sgd, lr {args.lr}, momentum 0.9, seed 0; "
        f"{args.repeats} rounds. LeNet-5 {args.lenet_epochs} epochs, CNN {args.cnn_epochs}.",
        "",
        "| model | partition | epoch time (median, range) | vs first | time to 85% | final "
        "accuracy | peak RSS of one process |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, (*_, names) in models.items():
        ok = {n: [x for x in runs[(model, n)] if "error" not in x] for n in names}
        base = statistics.median([x["epoch_s"] for x in ok[names[0]]] or [float("nan")])
        for name in names:
            good = ok[name]
            if not good:
                lines.append(f"| {model} | {name} | failed: {runs[(model, name)][0]} | | | | |")
                continue
            epoch = [x["epoch_s"] for x in good]
            tta = [x["time_to_target_s"] for x in good if x["time_to_target_s"] is not None]
            reached = f" [{len(tta)}/{len(good)}]"
            acc = statistics.mean(x["accuracy"] for x in good)
            peak = max(x["peak_mib"] for x in good)
            lines.append(
                f"| {model} | {name} | {spread(epoch)} | {base / statistics.median(epoch):.2f}x | "
                f"{spread(tta)}{reached} | {acc:.2%} | {peak:.0f} MiB |"
            )
    lines += ["", "Partitions as each run recorded them (summary.json `partition`):", ""]
    for name in models["lenet5"][2]:
        lines.append(f"- {name}: {runs[('lenet5', name)][0].get('partition')}")
    figure = Figure(figsize=(8, 4))
    FigureCanvasAgg(figure)
    for i, (model, (*_, names)) in enumerate(models.items()):
        ax = figure.add_subplot(1, 2, i + 1)
        medians = [
            statistics.median([x["epoch_s"] for x in runs[(model, n)] if "error" not in x] or [0])
            for n in names
        ]
        ax.bar(names, medians, color="#4c72b0")
        ax.set_title(f"{model}, global batch {GLOBAL_BATCH}")
        ax.set_ylabel("training time per epoch (s)")
        ax.set_xlabel("workers x threads")
    figure.tight_layout()
    return lines, figure


def link_bytes(cluster: EmulatedCluster) -> int:
    """Bytes the nodes have sent into the switch so far (its ports' receive counters)."""
    total = 0
    for i in range(cluster.nodes):
        path = f"/sys/class/net/port{i}/statistics/rx_bytes"
        out = subprocess.run(
            ["ip", "netns", "exec", cluster.switch, "cat", path],
            capture_output=True,
            text=True,
            check=True,
        )
        total += int(out.stdout)
    return total


def part_nodes(args: argparse.Namespace, scratch: Path) -> tuple[list[str], Figure]:
    reason = available()
    if reason is not None:
        raise SystemExit(f"part nodes needs network namespaces: {reason}")
    methods = args.methods.split(";")
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        for method in methods[r % len(methods) :] + methods[: r % len(methods)]:
            out = scratch / f"{method}-{r}".replace(":", "-").replace("=", "")
            name, _, settings = method.partition(":")  # e.g. two-level-easgd:tau=4
            extra = [a for kv in filter(None, settings.split(",")) for a in ("--set", kv)]
            argv = [
                "-m", "tether.run", "--method", name, *extra, "--epochs", str(args.node_epochs),
                "--target-accuracy", str(TARGET), "--stop-at-target", "--out", str(out),
                "--timeout", "60",
            ]  # fmt: skip
            with EmulatedCluster(2, link_mbit=args.link_mbit) as cluster:
                before = link_bytes(cluster)
                result = torchrun_across(cluster, 2, argv, timeout=900, python=sys.executable)
                sent = link_bytes(cluster) - before
            if not result.ok:
                record: dict[str, Any] = {"error": result.failure()}
            else:
                summary = json.loads((out / "summary.json").read_text())
                record = {
                    "time_to_target_s": summary["time_to_target_s"],
                    "steps": summary["steps"],
                    "accuracy": summary["final_metrics"]["accuracy"],
                    "link_bytes_per_step": sent / max(summary["steps"], 1),
                    "lr": summary["lr"],
                }
            runs.setdefault(method, []).append(record)
            print(f"  round {r} {method}: {record}", flush=True)
    lines = [
        f"2 emulated nodes x 2 ranks, each node's link capped at {args.link_mbit:g} Mbit/s; "
        f"LeNet-5, Fashion-MNIST, each method's defaults, stopping at {TARGET:.0%}; "
        f"{args.repeats} rounds.",
        "",
        "| method | time to 85% (median, range) | steps | link bytes per step | final accuracy |",
        "|---|---|---|---|---|",
    ]
    for method in methods:
        good = [x for x in runs[method] if "error" not in x]
        if not good:
            lines.append(f"| {method} | failed: {runs[method][0]['error']} | | | |")
            continue
        tta = [x["time_to_target_s"] for x in good if x["time_to_target_s"] is not None]
        steps = statistics.median(x["steps"] for x in good)
        per_step = statistics.median(x["link_bytes_per_step"] for x in good)
        acc = statistics.mean(x["accuracy"] for x in good)
        lines.append(
            f"| {method} | {spread(tta)} [{len(tta)}/{len(good)}] | {steps:.0f} | "
            f"{per_step / 1e3:.0f} kB | {acc:.2%} |"
        )
    figure = Figure(figsize=(8, 4))
    FigureCanvasAgg(figure)
    for i, (key, label) in enumerate(
        (("time_to_target_s", "time to 85% (s)"), ("link_bytes_per_step", "link bytes per step"))
    ):
        ax = figure.add_subplot(1, 2, i + 1)
        values = [
            statistics.median([x[key] or 0 for x in runs[m] if "error" not in x] or [0])
            for m in methods
        ]
        ax.bar(methods, values, color="#55a868")
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelrotation=15)
    figure.suptitle(f"2 nodes x 2 ranks, {args.link_mbit:g} Mbit/s links")
    figure.tight_layout()
    return lines, figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("partitions", "nodes"), required=True)
    parser.add_argument("--partitions", default="1x2,2x1,2x1-unpinned")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--lenet-epochs", type=int, default=3)
    parser.add_argument("--cnn-epochs", type=int, default=1)
    parser.add_argument("--cnn-partitions", default="1x2,2x1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--methods",
        default="two-level-easgd;two-level-easgd:tau=1;sync-sgd;sync-easgd",
        help="methods separated by ';', each optionally with settings: NAME:key=value,...",
    )
    parser.add_argument("--link-mbit", type=float, default=1000.0)
    parser.add_argument("--node-epochs", type=int, default=4)
    args = parser.parse_args()
    info = machine()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tether-partition-") as scratch:
        part = part_partitions if args.part == "partitions" else part_nodes
        lines, figure = part(args, Path(scratch))
    write_part_result(
        f"Chip partitioning: part {args.part}",
        f"partition_{args.part}",
        lines,
        figure,
        info,
        started,
    )


if __name__ == "__main__":
    main()
