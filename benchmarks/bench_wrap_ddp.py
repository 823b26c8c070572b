"""A user's own loop on ``ctx.wrap`` (sync-sgd) against the same loop on PyTorch DDP.

Both run side by side in ONE spawned gloo group of ``--workers`` CPU ranks, for each model (LeNet-5, 62k parameters, and the 4.8M-parameter CNN) on Fashion-MNIST-sized
inputs. Each rank builds the two from the same initial weights:

- Tether: ``ctx.wrap(model, SGD(...))`` on a context for the running group, the loop
  ``opt.zero_grad(); loss.backward(); opt.step()``;
- DDP: ``DistributedDataParallel(model)`` with its default buckets and the same loop.

Same batches (each step's slice of one global batch, sliced before the clock starts), same
learning rate and momentum. After a warm-up the two take turns: R rounds of K steps, the order
swapped every round so that drift (the other core, the allocator) hits both alike; a round is
timed between two barriers, so the slowest rank counts. The result per model is the ratio of
throughputs, Tether / DDP, per round: its median and its spread. At the end the two models'
weights are compared: they did the same arithmetic, so they must agree to float rounding.

    .venv/bin/python benchmarks/bench_wrap_ddp.py                     # both models
    .venv/bin/python benchmarks/bench_wrap_ddp.py --models cnn --rounds 20
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from _common import machine, machine_slug, write_result
from tether.api.context import Context
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data.sharding import GlobalBatchSampler
from tether.launch.env import DistEnv
from tether.launch.spawn import run_spawned
from tether.methods import Placement
from tether.models import build_model

SYSTEMS = ("tether", "ddp")
GOAL = 1.0  # Tether's throughput at least DDP's


class _Race:
    """The systems' loops over their own copies of the same batches, timed between barriers."""

    def __init__(self, systems: dict[str, Any], batches: Any) -> None:
        self.systems = systems
        self.batches = batches
        self.step_of = dict.fromkeys(systems, 0)

    def timed(self, name: str, count: int) -> float:
        model, opt = self.systems[name]
        work = self.batches(self.step_of[name], count)
        self.step_of[name] += count
        dist.barrier()
        start = time.perf_counter()
        for xb, yb in work:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            float(loss.detach())  # what a loop that logs its loss does
        dist.barrier()
        return time.perf_counter() - start


def _rank(rank: int, world: int, opts: dict[str, Any]) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    samples = opts["batch_size"] * world * (opts["warmup"] + opts["rounds"] * opts["steps"])
    x = torch.randn(min(samples, 8192), 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (len(x),), generator=gen)
    sampler = GlobalBatchSampler(len(x), opts["batch_size"] * world, seed=1)

    def batches(first: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for step in range(first, first + count):
            idx = sampler.worker_indices(step % sampler.steps_per_epoch, rank, world)
            out.append((x[idx], y[idx]))
        return out

    out: dict[str, Any] = {}
    for model_name in opts["models"]:
        torch.manual_seed(0)
        base = build_model(model_name, (1, 28, 28), 10)
        config = TrainConfig(
            method="sync-sgd",
            workers=world,
            batch_size=opts["batch_size"],
            bucket_mb=opts["bucket_mb"],
        )
        env = DistEnv(rank, world, rank, world, "127.0.0.1", None, None)
        ctx = Context(config, TorchTransport(), torch.device("cpu"), env, Placement(world))
        net = copy.deepcopy(base)
        tether_model, tether_opt = ctx.wrap(
            net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        )
        ddp = DistributedDataParallel(copy.deepcopy(base))
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        race = _Race({"tether": (tether_model, tether_opt), "ddp": (ddp, ddp_opt)}, batches)
        timed = race.timed
        for name in SYSTEMS:
            timed(name, opts["warmup"])
        seconds: dict[str, list[float]] = {name: [] for name in SYSTEMS}
        for r in range(opts["rounds"]):
            for name in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
                seconds[name].append(timed(name, opts["steps"]))
        diff = max(
            (a - b).abs().max().item()
            for a, b in zip(
                tether_model.state_dict().values(), ddp.module.state_dict().values(), strict=True
            )
        )
        assert ctx.method is not None
        ctx.method.finish(None)  # not ctx.finish(): the spawn helper ends the group
        out[model_name] = {
            "seconds": seconds,
            "max_param_diff": diff,
            "params": sum(p.numel() for p in base.parameters()),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lenet5,cnn")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--bucket-mb", type=float, default=1.0, help="Tether's fusion buckets")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    opts = {
        "models": args.models.split(","),
        "batch_size": args.batch_size,
        "warmup": args.warmup,
        "steps": args.steps,
        "rounds": args.rounds,
        "bucket_mb": args.bucket_mb,
    }
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    results = run_spawned(_rank, args.workers, opts, timeout_s=900.0)
    rows = []
    for model_name in opts["models"]:
        per_rank = [r[model_name] for r in results]
        rounds = {
            name: [max(r["seconds"][name][i] for r in per_rank) for i in range(args.rounds)]
            for name in SYSTEMS
        }
        ratios = [d / t for t, d in zip(rounds["tether"], rounds["ddp"], strict=True)]
        samples = args.steps * args.batch_size * args.workers
        rows.append(
            {
                "model": model_name,
                "params": per_rank[0]["params"],
                "tether_samples_s": samples / statistics.median(rounds["tether"]),
                "ddp_samples_s": samples / statistics.median(rounds["ddp"]),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "max_param_diff": max(r["max_param_diff"] for r in per_rank),
            }
        )
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    lines = [
        f"| model | params | Tether wrap (samples/s) | DDP (samples/s) | Tether/DDP median "
        f"| per-round spread | goal >= {GOAL:.1f}x | max weight diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        verdict = "PASS" if row["ratio_median"] >= GOAL else "FAIL"
        lines.append(
            f"| {row['model']} | {row['params']:,} | {row['tether_samples_s']:.0f} | "
            f"{row['ddp_samples_s']:.0f} | {row['ratio_median']:.3f}x | "
            f"{row['ratio_min']:.3f}x-{row['ratio_max']:.3f}x | {verdict} | "
            f"{row['max_param_diff']:.1e} |"
        )
    table = "\n".join(lines)
    print(table)
    info = machine()
    header = [
        "# A user's loop on ctx.wrap (sync-sgd) vs PyTorch DDP",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, "
        f"Python {info['python']}",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- command: `{command}`",
        f"- {args.workers} CPU workers (gloo), per-worker batch {args.batch_size}, Tether's "
        f"bucket_mb {args.bucket_mb:g} (DDP: its default 25 MiB buckets), "
        f"{args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up steps, the "
        "order swapped every round; a round is timed between barriers (the slowest rank).",
        f"- load average before: {load_before:.2f}; the run took "
        f"{time.perf_counter() - started:.0f} s.",
        "",
        table,
        "",
    ]
    out = args.out or Path(__file__).parent / "results" / f"wrap_ddp_{machine_slug(info)}.md"
    write_result(out, header)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
