"""Tether's synchronous SGD against PyTorch DDP, and time to 88% test accuracy, on CPU workers.

Part 1, throughput, side by side in ONE spawned gloo group. Every rank
builds three trainers from the same initial weights: Tether sync-sgd (fused, ``bucket_mb`` 1.0,
the default), Tether sync-sgd unfused (``bucket_mb=0``: one all-reduce per parameter) and
``torch.nn.parallel.DistributedDataParallel`` with its default buckets. Same data (the same
:class:`~tether.data.GlobalBatchSampler` steps for each system), same per-worker batch, same
lr/momentum. After a warm-up, the systems take turns: R rounds of K steps each, the order rotated
every round, so that drift (the other core's load, thermal, the allocator) hits all of them
alike. A round is timed between two barriers, so the slowest rank counts. Batches are sliced
from the in-memory data set before the first barrier, identically for every system, so a round
times forward, loss, backward, gradient all-reduce and the optimizer step (plus the per-step
``float(loss)`` that Tether's trainer also does). At the end the three models are compared: they
did the same arithmetic, so their weights must agree to float rounding, which checks that the
race was fair.

Part 2, time to target: ``tether train`` as a subprocess, timed from outside with
``time.perf_counter()``, so interpreter start-up, imports, data loading, the elastic launcher,
process spawn and rendezvous are all included.

Run from the repository root::

    .venv/bin/python benchmarks/bench_sync_sgd.py            # both parts, about 1 minute idle
    .venv/bin/python benchmarks/bench_sync_sgd.py --skip-tta # throughput only

A Markdown result file (machine, date, command, table) is written to ``--out``; anything below
the ``NOTES_MARKER`` line of an existing file is hand-written analysis and is kept.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
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

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from _common import machine, machine_slug, tether_command, write_result
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data import GlobalBatchSampler, load_dataset
from tether.launch.spawn import run_spawned
from tether.methods import MethodContext
from tether.methods.sync_sgd import SyncSGD
from tether.models import build_model
from tether.training.method_optimizer import MethodOptimizer

DDP_DEFAULT_BUCKET_MB = 25.0  # torch's default bucket_cap_mb (the first bucket is 1 MiB)
SYSTEMS = ("tether", "ddp", "tether-unfused")
LABELS = {
    "tether": "Tether sync-sgd (bucket_mb=1.0)",
    "ddp": "PyTorch DDP (defaults)",
    "tether-unfused": "Tether sync-sgd unfused (bucket_mb=0)",
}


# -- part 1: throughput --------------------------------------------------------------------------
class _TetherRunner:
    """The loop a user writes, on the optimizer ``ctx.wrap`` returns (the trainer's loop too)."""

    def __init__(self, model: torch.nn.Module, config: TrainConfig) -> None:
        context = MethodContext(config, TorchTransport(), torch.device("cpu"))
        self.method = SyncSGD(model, context)
        self.optimizer = MethodOptimizer(self.method)
        self.model = model
        self.comm_s = 0.0

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.comm_s += self.optimizer.last_times.comm_s
        return float(loss.detach())


class _DDPRunner:
    def __init__(self, model: torch.nn.Module, config: TrainConfig) -> None:
        self.ddp = DistributedDataParallel(model)  # default bucket_cap_mb (25 MiB)
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
        self.comm_s = float("nan")  # DDP does not expose its exposed communication time

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.ddp(x), y)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def _throughput_rank(rank: int, world: int, opts: dict[str, Any]) -> dict[str, Any]:
    data = load_dataset("fashion-mnist", None)
    batch = opts["batch_size"]
    sampler = GlobalBatchSampler(len(data.train_y), batch * world, opts["seed"])
    config = TrainConfig(workers=world, batch_size=batch, lr=opts["lr"], momentum=opts["momentum"])
    torch.manual_seed(opts["seed"])
    base = build_model("lenet5", data.sample_shape, data.num_classes)
    runners: dict[str, Any] = {
        "tether": _TetherRunner(copy.deepcopy(base), config),
        "ddp": _DDPRunner(copy.deepcopy(base), config),
        "tether-unfused": _TetherRunner(
            copy.deepcopy(base), dataclasses.replace(config, bucket_mb=0.0)
        ),
    }
    next_step = dict.fromkeys(SYSTEMS, 0)

    def batches(name: str, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for step in range(next_step[name], next_step[name] + count):
            idx = sampler.worker_indices(step, rank, world)
            out.append((data.train_x[idx], data.train_y[idx]))
        next_step[name] += count
        return out

    def timed(name: str, count: int) -> float:
        work = batches(name, count)
        runner = runners[name]
        dist.barrier()
        start = time.perf_counter()
        for x, y in work:
            runner.step(x, y)
        dist.barrier()
        return time.perf_counter() - start

    for name in SYSTEMS:
        timed(name, opts["warmup"])
        runners[name].comm_s = 0.0 if name != "ddp" else float("nan")
    seconds: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    for r in range(opts["rounds"]):
        order = SYSTEMS[r % len(SYSTEMS) :] + SYSTEMS[: r % len(SYSTEMS)]
        for name in order:
            seconds[name].append(timed(name, opts["steps"]))

    # Same init, same batches, same hyperparameters: the weights must agree to float rounding.
    ref = runners["tether"].model.state_dict()
    max_diff = {
        name: max(
            (ref[k] - v).abs().max().item() for k, v in runners[name].model.state_dict().items()
        )
        for name in ("ddp", "tether-unfused")
    }
    ddp_buckets = None
    try:  # private API, comma-separated bucket sizes in bytes; only used for a note
        sizes = runners["ddp"].ddp._get_ddp_logging_data().get("bucket_sizes")
        ddp_buckets = [int(b) for b in str(sizes).split(",") if b.strip()]
    except Exception:
        pass
    trained = max(
        (a - b).abs().max().item()
        for a, b in zip(
            runners["tether"].model.state_dict().values(), base.state_dict().values(), strict=True
        )
    )
    return {
        "seconds": seconds,
        "comm_s": {name: runners[name].comm_s for name in SYSTEMS},
        "max_param_diff": max_diff,
        "moved_from_init": trained,
        "tether_buckets": len(runners["tether"].method.bucketer.layout.buckets),
        "unfused_buckets": len(runners["tether-unfused"].method.bucketer.layout.buckets),
        "ddp_bucket_sizes": ddp_buckets,
        "params": sum(p.numel() for p in base.parameters()),
    }


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    opts = {
        "batch_size": args.batch_size,
        "lr": args.lr,
        "momentum": args.momentum,
        "seed": args.seed,
        "warmup": args.warmup,
        "steps": args.steps,
        "rounds": args.rounds,
    }
    load_before = os.getloadavg()[0]
    results = run_spawned(_throughput_rank, args.workers, opts, timeout_s=600.0)
    samples = args.steps * args.batch_size * args.workers
    per_system = {}
    for name in SYSTEMS:
        # Barriers make the ranks' round times nearly equal; take the slowest rank anyway.
        rounds = [max(r["seconds"][name][i] for r in results) for i in range(args.rounds)]
        rates = [samples / s for s in rounds]
        comm = [r["comm_s"][name] for r in results]
        per_system[name] = {
            "round_s": rounds,
            "samples_per_s": rates,
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
            "step_ms": 1e3 * statistics.median(rounds) / args.steps,
            "exposed_comm_share": statistics.mean(comm) / sum(rounds),
        }
    first = results[0]
    return {
        "systems": per_system,
        "ratio_tether_ddp": per_system["tether"]["median"] / per_system["ddp"]["median"],
        "ratio_unfused_ddp": per_system["tether-unfused"]["median"] / per_system["ddp"]["median"],
        # Paired per-round ratios too: the systems of one round saw the same machine load.
        "round_ratios": {
            name: [
                t / d
                for t, d in zip(
                    per_system[name]["samples_per_s"],
                    per_system["ddp"]["samples_per_s"],
                    strict=True,
                )
            ]
            for name in ("tether", "tether-unfused")
        },
        "max_param_diff": {
            k: max(r["max_param_diff"][k] for r in results) for k in first["max_param_diff"]
        },
        "moved_from_init": min(r["moved_from_init"] for r in results),
        "tether_buckets": first["tether_buckets"],
        "unfused_buckets": first["unfused_buckets"],
        "ddp_bucket_sizes": first["ddp_bucket_sizes"],
        "params": first["params"],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


# -- part 2: time to target ----------------------------------------------------------------------
def run_time_to_target(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-tta-") as tmp:
        out = Path(tmp) / "run"
        argv = [
            *tether_command(),
            "train",
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
            str(args.tta_epochs),
            "--batch-size",
            str(args.tta_batch_size),
            "--lr",
            str(args.tta_lr),
            "--momentum",
            str(args.tta_momentum),
            "--eval-every",
            str(args.tta_eval_every),
            "--seed",
            str(args.seed),
            "--out",
            str(out),
            "--no-progress",
        ]
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(
                f"tether train failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        summary = json.loads((out / "summary.json").read_text())
    shown = ["tether" if a == argv[0] else a for a in argv]
    shown[shown.index("--out") + 1] = "TMPDIR"
    return {
        "command": shlex.join(shown),
        "wall_s": wall,
        "time_to_target_s": summary["time_to_target_s"],
        "in_run_wall_s": summary["wall_time_s"],
        "final_test_accuracy": summary["final_test_accuracy"],
        "steps": summary["steps"],
        "epochs": summary["epochs"],
        "samples_per_s": summary["samples_per_s"],
        "comm_fraction": summary["comm_fraction"],
        "evaluations": len(summary["history"]),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


# -- reporting ------------------------------------------------------------------------------------
def throughput_table(tp: dict[str, Any]) -> list[str]:
    ddp = tp["systems"]["ddp"]["median"]
    lines = [
        "| system | median samples/s | min .. max over rounds | ms/step | vs DDP |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in SYSTEMS:
        s = tp["systems"][name]
        lines.append(
            f"| {LABELS[name]} | {s['median']:.0f} | {s['min']:.0f} .. {s['max']:.0f} "
            f"| {s['step_ms']:.2f} | {s['median'] / ddp:.3f}x |"
        )
    return lines


def rounds_table(tp: dict[str, Any]) -> list[str]:
    lines = ["| round | " + " | ".join(SYSTEMS) + " | tether / ddp |", "|---:" * 5 + "|"]
    for i, ratio in enumerate(tp["round_ratios"]["tether"]):
        rates = " | ".join(f"{tp['systems'][n]['samples_per_s'][i]:.0f}" for n in SYSTEMS)
        lines.append(f"| {i + 1} | {rates} | {ratio:.3f} |")
    return lines


def tta_table(tta: dict[str, Any], target: float) -> list[str]:
    ttt = tta["time_to_target_s"]
    return [
        "| command wall (start-up included) | in-run time to target | in-run wall | "
        "start-up + shutdown | final test accuracy | steps (epochs) |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {tta['wall_s']:.1f} s | "
        + (f"{ttt:.1f} s" if ttt is not None else f"not reached ({target:.0%})")
        + f" | {tta['in_run_wall_s']:.1f} s | {tta['wall_s'] - tta['in_run_wall_s']:.1f} s "
        f"| {tta['final_test_accuracy']:.2%} | {tta['steps']} ({tta['epochs']:.2f}) |",
    ]


def reading(args: argparse.Namespace, tp: dict | None, tta: dict | None) -> list[str]:
    out = []
    if tp is not None:
        ratio = tp["ratio_tether_ddp"]
        rr = tp["round_ratios"]["tether"]
        lo, hi = min(rr), max(rr)
        if lo > 1:
            verdict = "faster than DDP in every round"
        elif hi < 1:
            verdict = "slower than DDP in every round"
        else:
            verdict = "within round-to-round noise of DDP"
        out.append(
            f"- Fused Tether is {verdict}: ratio of medians {ratio:.3f}, median of the paired "
            f"per-round ratios {statistics.median(rr):.3f} (range {lo:.3f} .. {hi:.3f}). "
            f"Unfused Tether: {tp['ratio_unfused_ddp']:.3f} (paired median "
            f"{statistics.median(tp['round_ratios']['tether-unfused']):.3f})."
        )
        out.append(
            f"- LeNet-5 has {tp['params']:,} parameters ({tp['params'] * 4 / 1024:.0f} KiB of "
            f"fp32 gradient): Tether's 1 MiB buckets give {tp['tether_buckets']} bucket, DDP's "
            f"buckets (first 1 MiB, then {DDP_DEFAULT_BUCKET_MB:.0f} MiB) give "
            f"{len(tp['ddp_bucket_sizes'] or []) or '?'}; unfused Tether sends "
            f"{tp['unfused_buckets']} messages a step. So fused Tether and DDP both do one "
            "all-reduce per step, launched when backward has produced every gradient: neither "
            "can overlap communication with backward on this model, and the comparison is "
            "about per-step overheads (hooks, bucket copies, Python)."
        )
        out.append(
            f"- Tether's exposed communication (time waiting in `finish()`): "
            f"{tp['systems']['tether']['exposed_comm_share']:.0%} of round time fused, "
            f"{tp['systems']['tether-unfused']['exposed_comm_share']:.0%} unfused. It includes "
            "waiting for the slower rank (load imbalance), not only transfer time."
        )
        diff = tp["max_param_diff"]
        out.append(
            f"- Fairness check: after the same {args.warmup + args.rounds * args.steps} steps "
            f"the weights differ by at most {diff['ddp']:.1e} (DDP) and "
            f"{diff['tether-unfused']:.1e} (unfused) from fused Tether's (which moved "
            f"{tp['moved_from_init']:.2f} from its initial weights): all three did the same "
            "training"
            + (
                " (bitwise: sum-then-divide and divide-then-sum agree when dividing by 2)."
                if max(diff.values()) == 0
                else " (up to float rounding)."
            )
        )
        out.append(
            f"- Load average (1 min) {tp['load_before']:.2f} before, {tp['load_after']:.2f} after "
            f"part 1, on {os.cpu_count()} cores; other work on the machine slows every system, "
            "which the interleaving spreads evenly but cannot remove."
        )
    if tta is not None:
        ttt = tta["time_to_target_s"]
        goal = "met" if ttt is not None and tta["wall_s"] < 60 else "NOT met"
        out.append(
            f"- Time to {args.target:.0%}: {tta['wall_s']:.1f} s wall for the whole command "
            f"(goal < 60 s: {goal}); "
            + (f"{ttt:.1f} s of it" if ttt is not None else "target not reached")
            + f" inside the run, {tta['wall_s'] - tta['in_run_wall_s']:.1f} s start-up and "
            f"shutdown (imports, data load, launcher, spawn, rendezvous, result files). "
            f"Load average {tta['load_before']:.2f} before the run."
        )
    return out


def write_markdown(
    path: Path,
    args: argparse.Namespace,
    info: dict,
    command: str,
    tp: dict | None,
    tta: dict | None,
) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Sync SGD on {args.workers} workers: Tether vs PyTorch DDP, and time to "
        f"{args.target:.0%}",
        "",
        f"- Machine: `{info['host']}`, {info['cpu']}, {info['cores']} cores, no GPU",
        f"- Software: torch {info['torch']} (gloo), Python {info['python']}",
        f"- Date: {now}",
        f"- Command: `{command}`",
        "",
    ]
    if tp is not None:
        lines += [
            "## Throughput, measured side by side in one spawned run",
            "",
            f"LeNet-5 on Fashion-MNIST, {args.workers} gloo workers (1 thread each), "
            f"{args.batch_size} samples per worker per step (global {args.batch_size * args.workers}"
            f"), lr {args.lr}, momentum {args.momentum}, seed {args.seed}; {args.warmup} warm-up "
            f"steps per system, then {args.rounds} rounds of {args.steps} steps per system, "
            "interleaved (order rotated each round), each round timed between barriers. "
            "Samples/s are global (all workers).",
            "",
            *throughput_table(tp),
            "",
            f"Tether / DDP (median samples/s): **{tp['ratio_tether_ddp']:.3f}**. "
            f"Bucket caps: DDP {DDP_DEFAULT_BUCKET_MB:.0f} MiB (torch default; first bucket "
            "1 MiB), Tether 1.0 MiB (default `bucket_mb`).",
            "",
            "Per round (global samples/s, in the order the rounds ran):",
            "",
            *rounds_table(tp),
            "",
        ]
    if tta is not None:
        lines += [
            f"## Time to {args.target:.0%} test accuracy, start-up included",
            "",
            f"`{tta['command']}`, timed from outside with `time.perf_counter()`.",
            "",
            *tta_table(tta, args.target),
            "",
        ]
    lines += ["## Reading", "", *reading(args, tp, tta), ""]
    write_result(path, lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=40, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds per system")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps per system first")
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch (throughput)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-tta", action="store_true", help="skip the time-to-target run")
    p.add_argument("--target", type=float, default=0.88)
    p.add_argument("--tta-epochs", type=int, default=6, help="upper bound; stops at target")
    p.add_argument("--tta-batch-size", type=int, default=64)
    p.add_argument("--tta-lr", type=float, default=0.03)
    p.add_argument("--tta-momentum", type=float, default=0.9)
    p.add_argument("--tta-eval-every", type=int, default=117)
    p.add_argument("--out", type=Path, default=None, help="Markdown result file")
    args = p.parse_args()

    info = machine()
    out = args.out or Path(__file__).resolve().parent / "results" / (
        f"sync_sgd_{args.workers}workers_{machine_slug(info)}.md"
    )
    command = shlex.join(["python", *sys.argv])
    print(f"machine: {info['host']}, {info['cpu']}, {info['cores']} cores, torch {info['torch']}")
    print(f"command: {command}\n")

    print(
        f"[1/2] throughput: {args.workers} workers, {args.warmup} warm-up + {args.rounds} x "
        f"{args.steps} steps per system, interleaved ..."
    )
    tp = run_throughput(args)
    print("\n".join(throughput_table(tp)))
    print(f"Tether / DDP = {tp['ratio_tether_ddp']:.3f}\n")

    tta = None
    if not args.skip_tta:
        print(f"[2/2] time to {args.target:.0%} (tether train as a subprocess) ...")
        tta = run_time_to_target(args)
        print(tta["command"])
        print("\n".join(tta_table(tta, args.target)))
        print()
    print("\n".join(reading(args, tp, tta)))
    write_markdown(out, args, info, command, tp, tta)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
