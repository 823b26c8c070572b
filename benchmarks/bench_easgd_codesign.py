"""sync-easgd against original-easgd on a communication-heavy model, and each co-design switch.

SC17 (You, Buluc, Demmel, section 5) turns original EASGD (the master exchanges weights with the
workers one after another) into sync EASGD with a set of system changes and reports, for AlexNet
on CIFAR-10 on 8 GPUs: collectives instead of sequential exchanges 3.7x, weights kept on the GPU
1.3x, overlap 1.1x, 5.3x in all, and the communication share falling from 87% to 14%. This
benchmark measures the same switches in Tether, on CPU worker processes talking gloo over
loopback, with the 4.8M-parameter ``cnn`` model (one exchange = one 19 MB fp32 vector):

- ``original-easgd``: the server exchanges with workers 1..P strictly in turn (point-to-point);
- ``sync-easgd``: every switch on (one flat message, one all-reduce per round, overlapped with the
  next local step);
- ``sync-easgd --set single_message=false``: one all-reduce per layer (10 messages) instead of one;
- ``sync-easgd --set overlap=false``: the round's all-reduce is waited for at once.

Each variant is one ``tether train`` run (a subprocess: a fixed number of steps, ``--tau 1``,
evaluation only once at the end) and is read back from its ``summary.json``. The variants are
interleaved: every repeat runs all of them (order rotated each repeat), then medians are taken,
so drift in the machine's load hits them alike.

Definitions. A round is one elastic exchange of EVERY worker with the center: for sync-easgd
one all-reduce (``rounds`` in its summary), for original-easgd P point-to-point exchanges (its
summary counts exchanges, so rounds = exchanges / P). With ``--tau 1`` both do one round per
local step. Time per round = (``wall_time_s`` - ``evaluation_s``) / rounds: training time from
the first step to the last, the one final evaluation taken out, start-up not included. Comm share
= summary ``comm_fraction``: the time workers spend waiting for communication that was not
hidden (for original-easgd: the whole exchange with the server, queueing included), over worker
time, summed over workers.

Run from the repository root::

    .venv/bin/python benchmarks/bench_easgd_codesign.py            # about 7 minutes on 2 cores
    .venv/bin/python benchmarks/bench_easgd_codesign.py --workers 4 --repeats 2 --steps 20

Anything below the ``NOTES_MARKER`` line of an existing result file is kept when it is re-run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ForeignLoad, machine, machine_slug, tether_command, write_result

# name -> (method, --set overrides)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "sync-easgd": ("sync-easgd", []),
    "sync-easgd single_message=false": ("sync-easgd", ["single_message=false"]),
    "sync-easgd overlap=false": ("sync-easgd", ["overlap=false"]),
    "original-easgd": ("original-easgd", []),
}
BEST, ORIGINAL = "sync-easgd", "original-easgd"
NO_OVERLAP, PER_LAYER = "sync-easgd overlap=false", "sync-easgd single_message=false"


def train_argv(args: argparse.Namespace, variant: str, workers: int, out: Path) -> list[str]:
    method, sets = VARIANTS[variant]
    argv = [
        *tether_command(),
        "train",
        "--method",
        method,
        "--workers",
        str(workers),
        "--model",
        args.model,
        "--dataset",
        args.dataset,
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--lr",
        str(args.lr),
        "--tau",
        "1",
        "--eval-every",
        str(10**6),
        "--seed",
        str(args.seed),
        "--out",
        str(out),
        "--no-progress",
    ]
    for item in sets:
        argv += ["--set", item]
    return argv


def shown(argv: list[str]) -> str:
    words = ["tether" if a == argv[0] else a for a in argv]
    words[words.index("--out") + 1] = "TMPDIR"
    return shlex.join(words)


def run_variant(
    args: argparse.Namespace, variant: str, workers: int, tmp: Path, foreign: ForeignLoad
) -> dict[str, Any]:
    out = tmp / f"{variant.replace(' ', '_').replace('=', '-')}-{workers}w-{time.monotonic_ns()}"
    argv = train_argv(args, variant, workers, out)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    end = time.perf_counter()
    wall = end - start
    if proc.returncode != 0:
        raise SystemExit(f"{shown(argv)} failed (exit {proc.returncode}):\n{proc.stderr}")
    s = json.loads((out / "summary.json").read_text())
    exchanges = int(s["rounds"])
    # original-easgd counts point-to-point exchanges; a round is one exchange per worker.
    rounds = exchanges / workers if VARIANTS[variant][0] == ORIGINAL else exchanges
    train_s = s["wall_time_s"] - s["evaluation_s"]
    return {
        "round_s": train_s / rounds,
        "comm_fraction": s["comm_fraction"],
        "rounds": rounds,
        "exchanges": exchanges,
        "steps": s["steps"],
        "train_s": train_s,
        "command_s": wall,
        "split": {k: v / workers for k, v in s["time_split_s"].items()},
        "foreign_cores": foreign.cores(start, end),
    }


def measure(
    args: argparse.Namespace, workers: int, tmp: Path, foreign: ForeignLoad
) -> dict[str, list[dict]]:
    names = list(VARIANTS)
    samples: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            res = run_variant(args, name, workers, tmp, foreign)
            samples[name].append(res)
            print(
                f"  {workers} workers, repeat {r + 1}/{args.repeats}, {name:<32} "
                f"{1e3 * res['round_s']:7.1f} ms/round, comm share {res['comm_fraction']:.1%} "
                f"({res['command_s']:.0f} s with start-up; other work "
                f"{res['foreign_cores']:.2f} cores)",
                flush=True,
            )
    return samples


def summarize(samples: dict[str, list[dict]]) -> dict[str, Any]:
    med = {
        name: {
            "round_s": statistics.median(x["round_s"] for x in runs),
            "round_min": min(x["round_s"] for x in runs),
            "round_max": max(x["round_s"] for x in runs),
            "comm_fraction": statistics.median(x["comm_fraction"] for x in runs),
            "compute_s": statistics.median(x["split"]["compute"] / x["rounds"] for x in runs),
            "comm_s": statistics.median(x["split"]["comm"] / x["rounds"] for x in runs),
            "foreign_max": max(x["foreign_cores"] for x in runs),
        }
        for name, runs in samples.items()
    }

    def paired(slow: str, fast: str) -> list[float]:
        return [
            a["round_s"] / b["round_s"] for a, b in zip(samples[slow], samples[fast], strict=True)
        ]

    ratios = {
        # (label, slower, faster, paper's figure)
        "total": (ORIGINAL, BEST),
        "collectives": (ORIGINAL, NO_OVERLAP),
        "overlap": (NO_OVERLAP, BEST),
        "single message": (PER_LAYER, BEST),
    }
    return {
        "median": med,
        "ratios": {
            key: {
                "of_medians": med[slow]["round_s"] / med[fast]["round_s"],
                "paired": paired(slow, fast),
            }
            for key, (slow, fast) in ratios.items()
        },
    }


PAPER = {
    "total": "5.3x",
    "collectives": "3.7x",
    "overlap": "1.1x",
    "single message": "– (not given separately)",
}
SWITCH_TEXT = {
    "total": f"all switches: `{ORIGINAL}` -> `{BEST}`",
    "collectives": f"collectives instead of P sequential exchanges: `{ORIGINAL}` -> `{NO_OVERLAP}`",
    "overlap": f"overlap the round with the next local step: `{NO_OVERLAP}` -> `{BEST}`",
    "single message": f"one flat message instead of one per layer: `{PER_LAYER}` -> `{BEST}`",
}


def variant_table(res: dict[str, Any], workers: int) -> list[str]:
    lines = [
        f"| variant ({workers} workers) | ms per round (median) | min .. max | "
        "compute ms/round | exposed comm ms/round | comm share | other work (cores, max) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in VARIANTS:
        m = res["median"][name]
        lines.append(
            f"| `{name}` | {1e3 * m['round_s']:.1f} | {1e3 * m['round_min']:.1f} .. "
            f"{1e3 * m['round_max']:.1f} | {1e3 * m['compute_s']:.1f} | {1e3 * m['comm_s']:.1f} "
            f"| {m['comm_fraction']:.1%} | {m['foreign_max']:.2f} |"
        )
    return lines


def ratio_table(results: dict[int, dict[str, Any]]) -> list[str]:
    ws = sorted(results)
    head = "| co-design switch | paper (8 GPUs) | " + " | ".join(f"here, {w} workers" for w in ws)
    lines = [head + " |", "|---|---:|" + "---:|" * len(ws)]
    for key in ("collectives", "overlap", "single message", "total"):
        cells = []
        for w in ws:
            r = results[w]["ratios"][key]
            p = r["paired"]
            cells.append(f"{r['of_medians']:.2f}x (paired {min(p):.2f} .. {max(p):.2f})")
        lines.append(f"| {SWITCH_TEXT[key]} | {PAPER[key]} | " + " | ".join(cells) + " |")
    lines.append(
        "| weights kept on the accelerator | 1.3x | "
        + " | ".join("n/a (CPU only: weights never leave host memory)" for _ in ws)
        + " |"
    )
    share = []
    for w in ws:
        m = results[w]["median"]
        share.append(f"{m[ORIGINAL]['comm_fraction']:.0%} -> {m[BEST]['comm_fraction']:.0%}")
    lines.append(
        f"| comm share, `{ORIGINAL}` -> `{BEST}` | 87% -> 14% | " + " | ".join(share) + " |"
    )
    return lines


def parameter_count(args: argparse.Namespace) -> int:
    from tether.data import load_dataset
    from tether.models import build_model

    data = load_dataset(args.dataset, None)
    model = build_model(args.model, data.sample_shape, data.num_classes)
    return sum(p.numel() for p in model.parameters())


def write_markdown(
    path: Path,
    args: argparse.Namespace,
    info: dict[str, str],
    command: str,
    results: dict[int, dict[str, Any]],
    example: str,
    wall: float,
    loads: tuple[float, float],
    busy: tuple[float, str],
) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    params = parameter_count(args)
    lines = [
        "# EASGD co-design: sync-easgd vs original-easgd, switch by switch",
        "",
        f"- Machine: `{info['host']}`, {info['cpu']}, {info['cores']} cores, no GPU",
        f"- Software: torch {info['torch']} (gloo over loopback), Python {info['python']}",
        f"- Date: {now}",
        f"- Command: `{command}` ({wall:.0f} s wall; load average (1 min) {loads[0]:.2f} before, "
        f"{loads[1]:.2f} after; other work on the machine kept {busy[0]:.2f} cores busy on "
        f"average, CPU time by command: {busy[1]})",
        f"- Each run, e.g.: `{example}` (other variants add `--set single_message=false` or "
        "`--set overlap=false`, or use `--method original-easgd`)",
        "",
        f"Model `{args.model}` ({params:,} parameters on this data set; one flat fp32 exchange "
        f"is {params * 4 / 1e6:.1f} MB), data set `{args.dataset}`, {args.steps} steps per run, per-worker "
        f"batch {args.batch_size}, lr {args.lr}, tau 1, alpha 0.9/P, one evaluation at the end "
        f"(excluded). {args.repeats} repeats of every variant, interleaved (order rotated each "
        "repeat); medians. A round = one elastic exchange of every worker with the center "
        "(sync-easgd: one all-reduce; original-easgd: P point-to-point exchanges). Time per "
        "round = (wall_time_s - evaluation_s) / rounds from the run's summary.json. Comm share "
        "= summary comm_fraction (exposed communication over worker time).",
        "",
        "## Side by side with the paper",
        "",
        "Speed-up of time per round from each switch (ratio of medians; the range of the "
        "per-repeat paired ratios in brackets):",
        "",
        *ratio_table(results),
        "",
    ]
    for w in sorted(results):
        procs = f"{w} processes for sync-easgd, {w + 1} for original-easgd"
        lines += [f"## {w} workers ({procs})", "", *variant_table(results[w], w), ""]
    lines += [
        "Compute and exposed comm per round are per worker (summary time_split_s / workers / "
        "rounds); their sum is below the time per round by data loading and the time a worker "
        "is descheduled outside both (and, for original-easgd, nothing else: a worker's wait "
        "for its turn is in its comm).",
        "",
    ]
    write_result(path, lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--steps", type=int, default=30, help="steps (= rounds, tau 1) per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--batch-size", type=int, default=8, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="Markdown result file")
    args = p.parse_args()

    info = machine()
    out = args.out or Path(__file__).resolve().parent / "results" / (
        f"easgd_codesign_{machine_slug(info)}.md"
    )
    command = shlex.join(["python", *sys.argv])
    print(f"machine: {info['host']}, {info['cpu']}, {info['cores']} cores, torch {info['torch']}")
    print(f"command: {command}\n")
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-codesign-") as tmp, ForeignLoad() as foreign:
        example = shown(train_argv(args, BEST, args.workers[0], Path(tmp) / "run"))
        for w in args.workers:
            print(f"{w} workers: {len(VARIANTS)} variants x {args.repeats} repeats, interleaved")
            results[w] = summarize(measure(args, w, Path(tmp), foreign))
    wall = time.perf_counter() - start
    loads = (load_before, os.getloadavg()[0])
    busy = (foreign.cores(), foreign.top())
    print(f"other work on the machine: {busy[0]:.2f} cores on average ({busy[1]})")
    print()
    for w in sorted(results):
        print("\n".join(variant_table(results[w], w)))
        print()
    print("\n".join(ratio_table(results)))
    write_markdown(out, args, info, command, results, example, wall, loads, busy)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
