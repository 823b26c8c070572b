"""Every method with its defaults at 1, 2, 4 and 8 workers: does it train well at every count?

The defaults goal (LeNet-5 / Fashion-MNIST, everything but the method and the worker count left
at its default): every method reaches 85% test accuracy within 3 epochs, and sync-sgd, sync-easgd
and local-sgd reach 88% within 5 epochs. Each cell is one ``tether train`` run (seed 0) for 5
epochs (the three methods held to 88%) or 3 epochs (the others); its evaluations (at least four
per epoch) give the epochs and the training time to each target (evaluation pauses excluded,
start-up not counted), read from ``summary.json``'s history.

The same driver runs the sweeps that chose the defaults: ``--grid lr=0.025,0.05`` runs one cell
per value, ``--set key=value`` adds a setting to every cell. Cells are appended to a JSON-lines
file as they finish (``--cells``), so an interrupted run loses nothing and ``--reuse`` rebuilds the
table from the cells already run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_defaults.py                 # about 35 minutes on 2 cores
    .venv/bin/python benchmarks/bench_defaults.py --methods sync-sgd --workers 2 \
        --grid lr=0.025,0.05 --stem defaults_sweep

Anything below the ``NOTES_MARKER`` line of an existing result file is kept when it is re-run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from _common import RESULTS, ForeignLoad, machine, tether_command, write_part_result
from tether.methods import METHODS

# The goal: every method to 85% within 3 epochs; these three also to 88% within 5.
TARGETS = ((0.85, 3.0), (0.88, 5.0))
HELD_TO_88 = ("sync-sgd", "sync-easgd", "local-sgd")


def goals(method: str) -> tuple[tuple[float, float], ...]:
    """(target accuracy, epochs allowed) the method is held to."""
    return TARGETS if method in HELD_TO_88 else TARGETS[:1]


def cell_key(method: str, workers: int, settings: dict[str, str]) -> str:
    return json.dumps([method, workers, sorted(settings.items())])


def first_reached(history: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    return next((h for h in history if h["test_accuracy"] >= target), None)


def run_cell(method: str, workers: int, settings: dict[str, str], seed: int) -> dict[str, Any]:
    """One ``tether train`` run; its summary's numbers, or the one line it was refused with."""
    epochs = max(e for _, e in goals(method))
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            *tether_command(), "train", "--method", method, "--workers", str(workers),
            "--epochs", f"{epochs:g}", "--seed", str(seed), "--out", tmp, "--overwrite",
            "--no-progress",
        ]  # fmt: skip
        for key, value in settings.items():
            argv += ["--set", f"{key}={value}"]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        wall = time.perf_counter() - start
        summary_file = Path(tmp) / "summary.json"
        if done.returncode != 0 or not summary_file.exists():
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            return {"error": last[:300], "exit": done.returncode, "wall_s": wall}
        summary = json.loads(summary_file.read_text())
    history = summary["history"]
    reached = {}
    for target, _ in TARGETS:
        hit = first_reached(history, target)
        reached[f"{target:g}"] = (
            None if hit is None else {"epoch": hit["epoch"], "s": hit["time_s"]}
        )
    return {
        "lr": summary["lr"],
        "settings_run": summary.get("settings", {}),
        "global_batch": summary["global_batch_size"],
        "final": summary["final_test_accuracy"],
        "best": max((h["test_accuracy"] for h in history), default=0.0),
        "reached": reached,
        "wall_s": wall,
        "epochs": epochs,
    }


def verdict(method: str, cell: dict[str, Any]) -> tuple[bool, str]:
    """Whether the cell meets its goals, and the targets it missed."""
    if "error" in cell:
        return False, "refused or failed"
    missed = []
    for target, allowed in goals(method):
        hit = cell["reached"].get(f"{target:g}")
        if hit is None or hit["epoch"] > allowed + 1e-9:
            missed.append(f"{target:.0%} in {allowed:g} epochs")
    return not missed, ", ".join(missed)


def _at(cell: dict[str, Any], target: float) -> str:
    hit = cell.get("reached", {}).get(f"{target:g}")
    return "not reached" if hit is None else f"{hit['epoch']:.2f} ep, {hit['s']:.1f} s"


def table(cells: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| method | workers | settings | lr as run | global batch | to 85% | to 88% | final | best"
        " | goal | other load |",
        "|---|---:|---|---:|---:|---|---|---:|---:|---|---:|",
    ]
    for c in cells:
        given = ", ".join(f"{k}={v}" for k, v in sorted(c["settings"].items())) or "defaults"
        r = c["result"]
        if "error" in r:
            lines.append(
                f"| {c['method']} | {c['workers']} | {given} | – | – | – | – | – | – "
                f"| {r['error']} | {c.get('foreign_cores', 0):.2f} |"
            )
            continue
        ok, missed = verdict(c["method"], r)
        lines.append(
            f"| {c['method']} | {c['workers']} | {given} | {r['lr']:g} | {r['global_batch']} "
            f"| {_at(r, 0.85)} | {_at(r, 0.88)} | {r['final']:.2%} | {r['best']:.2%} "
            f"| {'PASS' if ok else 'FAIL: ' + missed} | {c.get('foreign_cores', 0):.2f} |"
        )
    return lines


def figure(cells: list[dict[str, Any]]) -> Any:
    """Epochs to 85% (and to 88% for the three held to it) per method, one bar per worker count."""
    methods = list(dict.fromkeys(c["method"] for c in cells))
    counts = sorted({c["workers"] for c in cells})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=False)
    for ax, (target, allowed) in zip(axes, TARGETS, strict=True):
        shown = [m for m in methods if any(t == target for t, _ in goals(m))]
        width = 0.8 / max(len(counts), 1)
        for j, workers in enumerate(counts):
            heights = []
            for m in shown:
                cell = next(
                    (c for c in cells if c["method"] == m and c["workers"] == workers), None
                )
                hit = None if cell is None else cell["result"].get("reached", {}).get(f"{target:g}")
                heights.append(float("nan") if hit is None else hit["epoch"])
            xs = [i + (j - (len(counts) - 1) / 2) * width for i in range(len(shown))]
            ax.bar(xs, heights, width, label=f"{workers} worker{'s' if workers > 1 else ''}")
        ax.axhline(allowed, color="red", linestyle="--", linewidth=1, label=f"goal: {allowed:g}")
        ax.set_xticks(range(len(shown)), shown, rotation=35, ha="right")
        ax.set_ylabel(f"epochs to {target:.0%} test accuracy")
        ax.set_title(f"epochs to {target:.0%} (missing bar: not reached)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def parse_pairs(items: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} takes KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS.names()))
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every cell")
    parser.add_argument("--grid", action="append", default=[], help="KEY=V1,V2,...: a cell each")
    parser.add_argument("--stem", default="defaults", help="the result file's name")
    parser.add_argument(
        "--title",
        default="Defaults at every worker count: LeNet-5 / Fashion-MNIST",
        help="the result file's heading",
    )
    parser.add_argument("--cells", type=Path, help="JSON-lines file of finished cells")
    parser.add_argument("--reuse", action="store_true", help="skip cells already in --cells")
    parser.add_argument(
        "--render", action="store_true", help="run nothing: the table of every cell in --cells"
    )
    args = parser.parse_args()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS.names()]
    if unknown:
        raise SystemExit(f"unknown method(s) {', '.join(unknown)}; see `tether list`")
    counts = [int(w) for w in args.workers.split(",")]
    fixed = parse_pairs(args.set, "--set")
    grid = {k: v.split(",") for k, v in parse_pairs(args.grid, "--grid").items()}
    variants = [
        dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())
    ]
    cells_file = args.cells or RESULTS / f"{args.stem}_cells.jsonl"
    done: dict[str, dict[str, Any]] = {}
    if (args.reuse or args.render) and cells_file.exists():
        for line in cells_file.read_text().splitlines():
            c = json.loads(line)
            done[cell_key(c["method"], c["workers"], c["settings"])] = c
    info, started = machine(), time.perf_counter()
    # --render: every cell, in the table's order (methods as `tether list` has them, then the
    # worker count), whatever order they were run and re-run in
    order = {name: i for i, name in enumerate(METHODS.names())}
    cells: list[dict[str, Any]] = (
        sorted(done.values(), key=lambda c: (order.get(c["method"], len(order)), c["workers"]))
        if args.render
        else []
    )
    todo = [] if args.render else itertools.product(methods, counts, variants)
    with ForeignLoad() as load:
        for method, workers, variant in todo:
            settings = {**fixed, **variant}
            key = cell_key(method, workers, settings)
            if key in done:
                cells.append(done[key])
                continue
            t0 = time.perf_counter()
            result = run_cell(method, workers, settings, args.seed)
            cell = {
                "method": method,
                "workers": workers,
                "settings": settings,
                "result": result,
                "foreign_cores": round(load.cores(t0, time.perf_counter()), 2),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            }
            cells.append(cell)
            with cells_file.open("a") as handle:
                handle.write(json.dumps(cell) + "\n")
            ok, missed = verdict(method, result)
            print(
                f"{method} x{workers} {settings or ''}: {_at(result, 0.85)} to 85%, "
                f"{_at(result, 0.88)} to 88%, {'PASS' if ok else 'FAIL ' + missed}",
                file=sys.stderr,
                flush=True,
            )
    passed = sum(verdict(c["method"], c["result"])[0] for c in cells)
    example = cells[0]["method"] if cells else methods[0]
    busy = max((c.get("foreign_cores", 0.0) for c in cells), default=0.0)
    lines = [
        f"Cells: {len(cells)}, goals met in {passed}. Each cell: `tether train --method M "
        f"--workers W --epochs 5|3 --seed {args.seed}` plus the settings shown (LeNet-5, "
        "Fashion-MNIST, per-worker batch 64 unless the method holds its global batch, as "
        "those whose workers step on their own batch do beyond 2 workers (sync-easgd beyond 1): "
        "the global batch "
        "column; everything else the method's default). Time: "
        "training time to the first evaluation at or above the target (evaluation pauses "
        "excluded, start-up not counted). Cells are run one after another, not interleaved; "
        f"other work on the machine kept at most {busy:.2f} cores busy during a cell (the "
        f"last column; every cell in `{cells_file.name}`).",
        "",
        *table(cells),
        "",
        f"Command per cell, e.g. `{shlex.join(['tether', 'train', '--method', example])} ...`",
    ]
    write_part_result(
        args.title,
        args.stem,
        lines,
        figure(cells),
        info,
        started,
    )


if __name__ == "__main__":
    main()
