"""All ten training methods on one job, and the SC17 paper's qualitative claims checked against it.

Runs ``tether compare`` (every method in ``tether list``, each with its own tuned defaults: see the
``defaults`` of each method class and ``results/method_defaults_sweep.md``) as a subprocess on
LeNet-5 / Fashion-MNIST with 4 workers, target 85% test accuracy, ``--stop-at-target`` and a
bounded epoch budget, timed from outside. It then reads ``compare.json`` and writes
``results/methods_4workers_<machine>.md`` (machine, date, command, the comparison table with each
method's settings, the figure ``compare.png`` copied next to it) with a section that checks the
paper's claims (You, Buluc, Demmel, SC17, section 6), each one a line with the two numbers and
PASS or FAIL:

- async-easgd reaches the target faster than async-sgd;
- async-measgd faster than async-msgd;
- hogwild-easgd faster than hogwild-sgd;
- sync-easgd among the fastest (within ``--tie-factor`` of the fastest method) and faster than
  original-easgd.

"Faster" compares ``time_to_target_s`` (training time from the first step until the first
evaluation at or above the target, evaluation pauses excluded); a method that never reaches the
target counts as infinitely slow. The methods run one after another, not interleaved: one run of
this script is one sample per method, and the asynchronous methods vary from run to run (the
order in which workers reach the server depends on scheduling).

Run from the repository root::

    .venv/bin/python benchmarks/bench_methods.py                 # about 4.5 minutes on 2 cores
    .venv/bin/python benchmarks/bench_methods.py --methods sync-sgd,sync-easgd --epochs 2

Anything below the ``NOTES_MARKER`` line of an existing result file is kept when it is re-run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from _common import ForeignLoad, machine, machine_slug, tether_command, write_result
from tether.methods import METHODS
from tether.observe.compare import markdown_table

# Single runs of the same setting differed by up to about this factor in time to target
# (results/method_defaults_sweep.md); a claim that passes by less is flagged.
NOISE = 1.25
# Foreign CPU (cores) during a method's run above which its line says the machine was busy.
BUSY_CORES = 0.25
# (faster, slower): the EASGD variant against the method the paper says it beats.
PAIRS = (
    ("async-easgd", "async-sgd"),
    ("async-measgd", "async-msgd"),
    ("hogwild-easgd", "hogwild-sgd"),
)


def run_compare(
    args: argparse.Namespace, out: Path
) -> tuple[dict[str, Any], str, float, dict[str, tuple[float, float]]]:
    """Run ``tether compare`` into ``out``; return compare.json, the shown command, its wall
    seconds and each method's (start, end) in ``time.perf_counter()`` time."""
    argv = [
        *tether_command(),
        "compare",
        "--workers",
        str(args.workers),
        "--model",
        "lenet5",
        "--dataset",
        "fashion-mnist",
        "--target-accuracy",
        str(args.target),
        "--stop-at-target",
        "--epochs",
        str(args.epochs),
        "--seed",
        str(args.seed),
        "--out",
        str(out),
        "--no-progress",
    ]
    if args.methods:
        argv[2:2] = ["--methods", args.methods]
    shown = ["tether" if a == argv[0] else a for a in argv]
    shown[shown.index("--out") + 1] = "OUT"
    starts: dict[str, float] = {}
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:  # "[i/N] METHOD on ..." as each method starts
            sys.stderr.write(line)
            if line.startswith("[") and "] " in line:
                starts[line.split("] ", 1)[1].split()[0]] = time.perf_counter()
        proc.wait()
        stdout.seek(0)
        text = stdout.read()
    end = time.perf_counter()
    if proc.returncode != 0 or not (out / "compare.json").exists():
        raise SystemExit(f"tether compare failed (exit {proc.returncode}):\n{text}")
    data = json.loads((out / "compare.json").read_text())
    order = sorted(starts, key=lambda m: starts[m])
    spans = {
        m: (starts[m], starts[order[i + 1]] if i + 1 < len(order) else end)
        for i, m in enumerate(order)
    }
    return data, shlex.join(shown), end - start, spans


def run_settings(row: dict[str, Any]) -> dict[str, Any]:
    """The resolved config of one method's run (its tuned defaults included)."""
    path = Path(row["run_dir"]) / "config.toml"
    return tomllib.loads(path.read_text()) if path.exists() else {}


def _tta(rows: dict[str, dict[str, Any]], method: str) -> float:
    row = rows.get(method)
    if row is None or row["status"] != "ok" or row["time_to_target_s"] is None:
        return math.inf
    return float(row["time_to_target_s"])


def _steps(rows: dict[str, dict[str, Any]], method: str, target: float) -> int | None:
    """The global step of the first evaluation at or above ``target``."""
    for entry in rows[method].get("history") or []:
        if entry["test_accuracy"] >= target:
            return entry.get("step")
    return None


def _split(rows: dict[str, dict[str, Any]], a: str, b: str, target: float) -> str:
    """Steps to target and training time per step of two methods: statistical against
    hardware efficiency."""
    parts = []
    for m in (a, b):
        steps, tta = _steps(rows, m, target), _tta(rows, m)
        if steps and not math.isinf(tta):
            parts.append(f"{m} {steps} steps at {1e3 * tta / steps:.0f} ms")
    return f"steps to target and training time per step: {', '.join(parts)}" if parts else ""


def _fmt(seconds: float) -> str:
    return "not reached" if math.isinf(seconds) else f"{seconds:.1f} s"


def _notes(rows: dict[str, dict[str, Any]], methods: tuple[str, ...], margin: float) -> str:
    """What a reader should know about one comparison: a small margin, a busy machine."""
    notes = []
    if 1 <= margin < NOISE:
        notes.append(f"margin within the run-to-run noise of single runs (~{NOISE:.2f}x)")
    for m in methods:
        busy = rows[m].get("foreign_cores", 0.0)
        if busy >= BUSY_CORES:
            notes.append(f"{m} ran while other work kept {busy:.1f} cores busy")
    return f" [{'; '.join(notes)}]" if notes else ""


def claims(rows: dict[str, dict[str, Any]], target: float, tie: float) -> list[tuple[str, bool]]:
    """Each claim of the paper as (one line with both numbers, passed)."""
    out = []
    for fast, slow in PAIRS:
        if fast not in rows or slow not in rows:
            continue
        a, b = _tta(rows, fast), _tta(rows, slow)
        ok = a < b
        margin = b / a if ok and not math.isinf(b) else math.inf
        out.append(
            (
                f"{fast} reaches {target:.0%} faster than {slow}: {_fmt(a)} vs {_fmt(b)}"
                + (f" ({margin:.2f}x)" if not math.isinf(margin) else "")
                + _notes(rows, (fast, slow), margin),
                ok,
            )
        )
    if "sync-easgd" in rows:
        s = _tta(rows, "sync-easgd")
        best_method = min(rows, key=lambda m: _tta(rows, m))
        best = _tta(rows, best_method)
        ok = not math.isinf(s) and s <= tie * best
        ratio = f"{s / best:.2f}x the fastest" if not math.isinf(s + best) else "–"
        out.append(
            (
                f"sync-easgd is among the fastest (within {tie:.2f}x): {_fmt(s)} vs the fastest, "
                f"{best_method}, {_fmt(best)} ("
                + "; ".join(
                    x for x in (ratio, _split(rows, "sync-easgd", best_method, target)) if x
                )
                + ")"
                + _notes(rows, ("sync-easgd", best_method), math.inf),
                ok,
            )
        )
        if "original-easgd" in rows:
            o = _tta(rows, "original-easgd")
            ok = s < o
            margin = o / s if ok and not math.isinf(o) else math.inf
            out.append(
                (
                    f"sync-easgd reaches {target:.0%} faster than original-easgd: {_fmt(s)} vs "
                    f"{_fmt(o)}"
                    + " ("
                    + "; ".join(
                        x
                        for x in (
                            f"{margin:.2f}x" if not math.isinf(margin) else "",
                            _split(rows, "sync-easgd", "original-easgd", target),
                        )
                        if x
                    )
                    + ")"
                    + _notes(rows, ("sync-easgd", "original-easgd"), margin),
                    ok,
                )
            )
    return out


def _g(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else "?" if value is None else str(value)


def settings_table(rows: list[dict[str, Any]], workers: int, cores: int) -> list[str]:
    lines = [
        "| method | processes | cores per process | batch | lr | momentum | tau | alpha "
        "| time to target (s) | epochs run | other work (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        method = row["method"]
        procs = workers + METHODS.get(method).server_processes
        head = f"| {method} | {procs} | {cores / procs:.2f} "
        if row["status"] != "ok":
            lines.append(head + f"| – | – | – | – | – | failed | – | {row['foreign_cores']:.2f} |")
            continue
        cfg, ran = row["config"], row.get("settings") or {}
        elastic = "easgd" in method
        uses_momentum = method in ("sync-sgd", "local-sgd", "async-measgd", "async-msgd")
        uses_tau = elastic or method in ("local-sgd", "async-sgd", "async-msgd")
        alpha = cfg.get("alpha")
        if not elastic:
            alpha_text = "–"
        elif alpha is None:  # the method's default, as its run computed it (two-level: nodes)
            alpha_text = f"0.9/P = {_g(ran.get('alpha', 0.9 / workers))}"
        else:
            alpha_text = str(alpha)
        ttt = row["time_to_target_s"]
        lines.append(
            head + f"| {ran.get('batch_size', '?')} | {_g(ran.get('lr'))} "
            f"| {_g(ran.get('momentum')) if uses_momentum else 'none'} "
            f"| {cfg.get('tau', '?') if uses_tau else '–'} | {alpha_text} "
            f"| {'not reached' if ttt is None else f'{ttt:.1f}'} "
            f"| {row['steps'] / row['steps_per_epoch']:.2f} | {row['foreign_cores']:.2f} |"
        )
    return lines


def write_markdown(
    path: Path,
    args: argparse.Namespace,
    info: dict[str, str],
    command: str,
    compare_command: str,
    data: dict[str, Any],
    wall: float,
    loads: tuple[float, float],
    busy: tuple[float, str],
    checks: list[tuple[str, bool]],
) -> None:
    rows = data["rows"]
    settings = data["settings"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cores = int(info["cores"])
    server = [r["method"] for r in rows if METHODS.get(r["method"]).server_processes]
    passed = sum(ok for _, ok in checks)
    batch = settings["batch_size"]  # None: the methods ran with different batches
    batch_text = (
        f"per-worker batch {batch} (global {batch * args.workers})"
        if batch is not None
        else "each method's own per-worker batch (its row in the settings table)"
    )
    lines = [
        f"# All methods on {args.workers} workers: LeNet-5 / Fashion-MNIST, time to "
        f"{args.target:.0%}",
        "",
        f"- Machine: `{info['host']}`, {info['cpu']}, {info['cores']} cores, no GPU",
        f"- Software: torch {info['torch']} (gloo), Python {info['python']}",
        f"- Date: {now}",
        f"- Command: `{command}`, which runs `{compare_command}` (OUT a temporary directory"
        + (f", kept as `{args.keep}`" if args.keep else "")
        + ")",
        f"- Whole comparison: {wall:.0f} s wall; load average (1 min) {loads[0]:.2f} before, "
        f"{loads[1]:.2f} after; other work on the machine (processes outside this benchmark) "
        f"kept {busy[0]:.2f} cores busy on average (CPU time by command: {busy[1]}; per method "
        "in the settings table)",
        "",
        "Each method runs with its own tuned defaults (the `defaults` of its class in "
        '`src/tether/methods/`, README "Methods"); everything else is shared: '
        f"{args.workers} workers, {batch_text}, seed {args.seed}, at most "
        f"{args.epochs} epochs, stopping at the first evaluation (four per epoch) at or above "
        f"{args.target:.0%}. Time to target is training time from the first step, evaluation "
        "pauses excluded; start-up (about 10 s a method) is not in it.",
        "",
        "## Comparison (from compare.json)",
        "",
        markdown_table(rows, settings["target_accuracy"]),
        "",
        "Comm share: communication not hidden behind computation, as a share of worker time "
        "(for server methods this includes waiting for the server's reply). Rounds: "
        "communication rounds (for server methods: worker-server exchanges) where the method "
        "counts them, else optimizer steps.",
        "",
        "Per-method settings as run (batch, rate and momentum as the optimizer took them, from "
        "each run's summary.json; tau and alpha from its config.toml):",
        "",
        *settings_table(rows, args.workers, cores),
        "",
        f"![test accuracy against training time, and the time split]({path.stem}.png)",
        "",
        f"## The paper's claims, checked ({passed} of {len(checks)} pass)",
        "",
        *[f"- {'PASS' if ok else 'FAIL'}: {text}" for text, ok in checks],
        "",
        "## Caveats",
        "",
        f"- Oversubscription: this machine has {cores} cores. The methods with a server "
        f"({', '.join(server)}) run {args.workers} workers + 1 server = {args.workers + 1} "
        f"processes, the others {args.workers}; every process is single-threaded, so even "
        f"{args.workers} processes share {cores} cores ({cores / args.workers:.2f} core each) "
        f"and a server method gets {cores / (args.workers + 1):.2f} core per process. The "
        "server competes with the workers for CPU instead of sitting on its own node, which "
        "slows every server method that exchanges through it (most of all the round-robin "
        "original-easgd, where every exchange waits for the server to be scheduled; the Hogwild "
        "server only watches and evaluates, so it costs little). The paper's claims are about "
        "dedicated devices; these numbers are about a shared 2-core box.",
        "- One seed, one run per method: the asynchronous methods (async-*, hogwild-*) vary "
        "from run to run because the order in which workers reach the server depends on "
        "scheduling; see `method_defaults_sweep.md` for repeat runs. sync-sgd, sync-easgd and "
        "local-sgd are deterministic in their arithmetic, only their timing varies.",
        "- Time to target moves in steps of one evaluation interval (a quarter epoch, about "
        "1.5-2 s of training here), so differences smaller than that are not resolved.",
        "",
    ]
    write_result(path, lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=4, help="upper bound; each run stops at target")
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default=None, help="comma-separated (default: all)")
    p.add_argument("--tie-factor", type=float, default=1.25, help="'among the fastest' bound")
    p.add_argument("--keep", type=Path, default=None, help="keep the compare directory here")
    p.add_argument("--out", type=Path, default=None, help="Markdown result file")
    args = p.parse_args()

    info = machine()
    out = args.out or Path(__file__).resolve().parent / "results" / (
        f"methods_{args.workers}workers_{machine_slug(info)}.md"
    )
    command = shlex.join(["python", *sys.argv])
    print(f"machine: {info['host']}, {info['cpu']}, {info['cores']} cores, torch {info['torch']}")
    print(f"command: {command}\n")

    with tempfile.TemporaryDirectory(prefix="bench-methods-") as tmp:
        compare_dir = args.keep or Path(tmp) / "compare"
        if args.keep and args.keep.exists():
            shutil.rmtree(args.keep)
        load_before = os.getloadavg()[0]
        with ForeignLoad() as foreign:
            data, compare_command, wall, spans = run_compare(args, compare_dir)
        loads = (load_before, os.getloadavg()[0])
        for row in data["rows"]:
            row["foreign_cores"] = foreign.cores(*spans.get(row["method"], (0.0, 0.0)))
            row["config"] = run_settings(row)  # row["settings"]: what the run used
            summary = Path(row["run_dir"]) / "summary.json"
            if summary.exists():
                s = json.loads(summary.read_text())
                row["steps_per_epoch"] = s["steps"] / s["epochs"] if s["epochs"] else 1
        out.parent.mkdir(parents=True, exist_ok=True)
        png = compare_dir / "compare.png"
        if png.exists():
            shutil.copyfile(png, out.with_suffix(".png"))

    rows = {row["method"]: row for row in data["rows"]}
    checks = claims(rows, args.target, args.tie_factor)
    print(markdown_table(data["rows"], data["settings"]["target_accuracy"]))
    print()
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}: {text}")
    busy = (foreign.cores(), foreign.top())
    print(f"other work on the machine: {busy[0]:.2f} cores on average ({busy[1]})")
    write_markdown(out, args, info, command, compare_command, data, wall, loads, busy, checks)
    print(f"\nwrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
