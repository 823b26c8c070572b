"""Large-batch training: momentum SGD with the linear scaling rule, a tuned Nesterov, LARS and LAMB
from batch 256 to 8192 (16384 on request), and mixed precision's throughput.

Part ``batches``. LeNet-5 with batch norm on Fashion-MNIST, the same epoch budget for every cell,
through ``tether.fit`` (sync-sgd; one worker with gradient accumulation reaches the large global
batches: sync-sgd's update is the same for any worker count at a given global batch, which the
test suite checks, so one process measures what P workers would). Per global batch B:

- ``momentum``: SGD, momentum 0.9, the linear scaling rule from 0.05 at 256 (``lr_base_batch``),
  a linear warm-up over the first ``--warmup-epochs``, constant after (Goyal et al. 2017);
- ``nesterov``: SGD with Nesterov momentum, warm-up, cosine decay, the learning rate tuned at
  seed 0 over a 3-point grid around the scaled rate;
- ``lars``: LARS (eta 0.001, weight decay 5e-4, biases and batch-norm parameters excluded),
  warm-up, polynomial decay of power 2 (Jia et al. 2018), the rate tuned the same way;
- ``lamb``: LAMB (weight decay 0.01), warm-up, polynomial decay, the rate tuned the same way.

Each tuned cell takes its best rate at seed 0 (final accuracy) and runs ``--seeds`` seeds with
it. Reported: final test accuracy (mean and spread over seeds) and the training time to 88%.
Also LARS under sync-easgd and async-easgd at 4096 (2 workers), a combination no published
system offers.

Part ``precision``. fp32, bf16 and fp16 under sync-sgd, 2 workers, LeNet-5 (1 epoch) and the
4.8M-parameter CNN (``--cnn-steps`` steps), taking turns (``--repeats`` rounds, the order rotated):
training samples/s (start-up and the one evaluation at the end excluded) and final accuracy side
by side.

    .venv/bin/python benchmarks/bench_large_batch.py --part batches      # ~70 min on 2 cores
    .venv/bin/python benchmarks/bench_large_batch.py --part precision    # ~10 min
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from _common import machine, write_part_result

BASE_BATCH, MICRO_BATCH, TARGET = 256, 512, 0.88
OPTIMIZERS = ("momentum", "nesterov", "lars", "lamb")
GRID = (0.5, 1.0, 2.0)  # multiples of a cell's starting rate tried at seed 0


def starting_lr(optimizer: str, batch: int) -> float:
    """The rate a cell starts from: the linear scaling rule for the SGD family (0.05 at 256),
    LARS's global rate likewise (4.0 at 256, its trust ratio scales it per layer), and the
    square-root rule for LAMB (4e-3 at 256, as Adam-type optimizers are usually scaled). The
    LARS and LAMB bases were moved up once after a 1-epoch trial at 4096 put their best rate at
    the top of the grid."""
    ratio = batch / BASE_BATCH
    return {"momentum": 0.05, "nesterov": 0.05, "lars": 4.0, "lamb": 4e-3}[optimizer] * (
        ratio if optimizer != "lamb" else ratio**0.5
    )


def cell_options(optimizer: str, batch: int, lr: float, args: argparse.Namespace) -> dict[str, Any]:
    micro = min(batch, MICRO_BATCH)
    options: dict[str, Any] = {
        "batch_size": micro,
        "accumulate": batch // micro,
        "epochs": args.epochs,
        "warmup_epochs": args.warmup_epochs if batch > BASE_BATCH else 0.0,
        "momentum": 0.9,
        "lr": lr,
    }
    if optimizer == "momentum":
        options.update(optimizer="sgd", lr=0.05, lr_base_batch=BASE_BATCH, weight_decay=5e-4)
    elif optimizer == "nesterov":
        options.update(optimizer="sgd", nesterov=True, lr_schedule="cosine", weight_decay=5e-4)
    elif optimizer == "lars":
        options.update(optimizer="lars", lr_schedule="poly", weight_decay=5e-4)
    else:
        options.update(optimizer="lamb", lr_schedule="poly", weight_decay=0.01)
    return options


def run_fit(options: dict[str, Any], out: Path, method: str = "sync-sgd", workers: int = 1) -> dict:
    """One ``tether.fit`` in its own interpreter (so two can run side by side)."""
    out.mkdir(parents=True, exist_ok=True)
    spec = {
        "model": "lenet5-bn",
        "train_data": "fashion-mnist",
        "method": method,
        "workers": workers,
        "target": f"accuracy>={TARGET}",
        "out": str(out),
        **options,
    }
    code = (
        "import json, sys, tether\n"
        "spec = json.loads(sys.argv[1])\n"
        "if __name__ == '__main__':\n"
        "    result = tether.fit(**spec)\n"
    )
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    summary = json.loads((out / "summary.json").read_text())
    return {
        "accuracy": summary["final_metrics"].get("accuracy"),
        "time_to_target_s": summary["time_to_target_s"],
        "wall_s": time.perf_counter() - started,
        "steps": summary["steps"],
    }


def part_batches(args: argparse.Namespace, scratch: Path) -> tuple[list[str], Figure]:
    batches = [int(b) for b in args.batches.split(",")]
    pool = ThreadPoolExecutor(max_workers=args.parallel)
    results: dict[tuple[str, int], dict[str, Any]] = {}

    def job(optimizer: str, batch: int, lr: float, seed: int) -> dict[str, Any]:
        options = {**cell_options(optimizer, batch, lr, args), "seed": seed}
        out = scratch / f"{optimizer}-{batch}-{lr:g}-{seed}"
        record = run_fit(options, out)
        print(f"  {optimizer:9} B={batch:<6} lr={lr:<8.4g} seed {seed}: {record}", flush=True)
        return record

    # Seed 0: the grid for the tuned optimizers, the rule for momentum.
    tuning = {
        (o, b, lr): pool.submit(job, o, b, lr, 0)
        for b in batches
        for o in OPTIMIZERS
        for lr in (
            [starting_lr(o, b)] if o == "momentum" else [m * starting_lr(o, b) for m in GRID]
        )
    }
    best: dict[tuple[str, int], float] = {}
    for o in OPTIMIZERS:
        for b in batches:
            tried = {lr: f.result() for (oo, bb, lr), f in tuning.items() if (oo, bb) == (o, b)}
            ok = {lr: r for lr, r in tried.items() if r.get("accuracy") is not None}
            lr = max(ok, key=lambda v: ok[v]["accuracy"]) if ok else next(iter(tried))
            best[(o, b)] = lr
            results[(o, b)] = {"lr": lr, "runs": [tried[lr]], "grid": tried}
    more = {
        (o, b, seed): pool.submit(job, o, b, best[(o, b)], seed)
        for o in OPTIMIZERS
        for b in batches
        for seed in range(1, args.seeds)
    }
    for (o, b, _), future in more.items():
        results[(o, b)]["runs"].append(future.result())
    # LARS under the EASGD methods at 4096: 2 workers, one run at a time.
    easgd = {}
    for method in ("sync-easgd", "async-easgd"):
        lr = best.get(("lars", 4096), starting_lr("lars", 4096))
        options = cell_options("lars", 4096, lr, args)
        options["batch_size"], options["accumulate"] = 512, 4  # 2 workers x 512 x 4
        easgd[method] = run_fit(options, scratch / f"lars-{method}", method=method, workers=2)
        print(f"  lars under {method} at 4096: {easgd[method]}", flush=True)
    pool.shutdown()

    def cell(o: str, b: int) -> str:
        runs = [r for r in results[(o, b)]["runs"] if r.get("accuracy") is not None]
        if not runs:
            return "failed"
        accuracies = [r["accuracy"] for r in runs]
        times = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
        spread = f" ({min(accuracies):.2%}-{max(accuracies):.2%})" if len(runs) > 1 else ""
        tta = f"{statistics.median(times):.0f} s" if times else "not reached"
        reached = f" [{len(times)}/{len(runs)}]" if len(runs) > 1 else ""
        return f"{statistics.mean(accuracies):.2%}{spread}; 88%: {tta}{reached}; lr {results[(o, b)]['lr']:.3g}"

    lines = [
        f"| global batch | {' | '.join(OPTIMIZERS)} |",
        "|---|" + "---|" * len(OPTIMIZERS),
    ]
    for b in batches:
        lines.append(f"| {b} | " + " | ".join(cell(o, b) for o in OPTIMIZERS) + " |")
    lines += ["", "LARS (its 4096 rate) under the elastic methods, 2 workers x 512 x 4:", ""]
    for method, record in easgd.items():
        lines.append(f"- {method}: {record}")
    lines += ["", "Seed-0 grids (lr: final accuracy):", ""]
    for (o, b), cell_result in sorted(results.items()):
        grid = ", ".join(
            f"{lr:.3g}: {r['accuracy']:.2%}"
            if r.get("accuracy") is not None
            else f"{lr:.3g}: failed"
            for lr, r in sorted(cell_result["grid"].items())
        )
        lines.append(f"- {o} at {b}: {grid}")

    figure = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot(1, 1, 1)
    for o in OPTIMIZERS:
        means = []
        for b in batches:
            accs = [r["accuracy"] for r in results[(o, b)]["runs"] if r.get("accuracy") is not None]
            means.append(statistics.mean(accs) if accs else float("nan"))
        ax.plot(batches, means, marker="o", label=o)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch")
    ax.set_ylabel(f"test accuracy after {args.epochs} epochs")
    ax.set_title("LeNet-5 (batch norm), Fashion-MNIST")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return lines, figure


def training_rate(summary: dict[str, Any]) -> float:
    """Samples per second of training: every worker's samples over the training time of the
    last history entry (start-up and evaluation excluded)."""
    seconds = summary["history"][-1]["time_s"]
    return summary["steps"] * summary["global_batch_size"] / max(seconds, 1e-9)


def part_precision(args: argparse.Namespace, scratch: Path) -> tuple[list[str], Figure]:
    precisions = ("fp32", "bf16", "fp16")
    # One evaluation, at the end; the rate is over training time (evaluation pauses excluded).
    models = {
        "lenet5": {"epochs": 1, "eval_every": 10**6},
        "cnn": {"steps": args.cnn_steps, "eval_every": 10**6},
    }
    rates: dict[tuple[str, str], list[float]] = {}
    accuracy: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats):
        for name, length in models.items():
            order = precisions[r % 3 :] + precisions[: r % 3]
            for precision in order:
                out = scratch / f"{name}-{precision}-{r}"
                spec = {"model": name, "train_data": "fashion-mnist", "method": "sync-sgd",
                        "workers": 2, "batch_size": 64, "lr": 0.05, "precision": precision,
                        "out": str(out), **length}  # fmt: skip
                code = "import json, sys, tether\nif __name__ == '__main__':\n    tether.fit(**json.loads(sys.argv[1]))\n"
                proc = subprocess.run(
                    [sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True
                )
                if proc.returncode != 0:
                    print(f"  {name} {precision}: failed: {proc.stderr[-300:]}", flush=True)
                    continue
                summary = json.loads((out / "summary.json").read_text())
                rate = training_rate(summary)
                rates.setdefault((name, precision), []).append(rate)
                accuracy.setdefault((name, precision), []).append(
                    summary["final_metrics"]["accuracy"]
                )
                print(f"  {name} {precision}: {rate:.0f} samples/s, "
                      f"accuracy {summary['final_metrics']['accuracy']:.2%}", flush=True)  # fmt: skip
    lines = [
        "| model | precision | samples/s (median; range) | vs fp32 | final accuracy |",
        "|---|---|---|---|---|",
    ]
    for name in models:
        base = statistics.median(rates.get((name, "fp32"), [float("nan")]))
        for precision in precisions:
            values = rates.get((name, precision))
            if not values:
                lines.append(f"| {name} | {precision} | failed | | |")
                continue
            median = statistics.median(values)
            accs = accuracy[(name, precision)]
            lines.append(
                f"| {name} | {precision} | {median:.0f} ({min(values):.0f}-{max(values):.0f}) | "
                f"{median / base:.2f}x | {statistics.mean(accs):.2%} |"
            )
    figure = Figure(figsize=(7, 4))
    FigureCanvasAgg(figure)
    for i, name in enumerate(models):
        ax = figure.add_subplot(1, 2, i + 1)
        medians = [statistics.median(rates.get((name, p), [0.0])) for p in precisions]
        ax.bar(precisions, medians, color=["#4c72b0", "#dd8452", "#55a868"])
        ax.set_title(name)
        ax.set_ylabel("samples/s (sync-sgd, 2 CPU workers)")
    figure.tight_layout()
    return lines, figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("batches", "precision"), required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--warmup-epochs", type=float, default=2.0)
    parser.add_argument("--batches", default="256,4096,8192")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=2, help="runs side by side (part batches)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds (part precision)")
    parser.add_argument("--cnn-steps", type=int, default=60)
    args = parser.parse_args()
    info = machine()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tether-large-batch-") as scratch:
        part = part_batches if args.part == "batches" else part_precision
        lines, figure = part(args, Path(scratch))
    write_part_result(
        f"Large-batch training: part {args.part}",
        f"large_batch_{args.part}",
        lines,
        figure,
        info,
        started,
    )


if __name__ == "__main__":
    main()
