"""Large-batch training: momentum SGD with the linear scaling rule, a tuned Nesterov, LARS and LAMB
from batch 256 to 8192 (16384 on request), and mixed precision's throughput.

Part ``batches``. LeNet-5 with batch norm (``--model cnn``: the 4.8M-parameter CNN, which has
none) on Fashion-MNIST, the same epoch budget for every cell,
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

Each tuned cell tries its 3-point grid at seed 0 and, while the best final accuracy sits at the
grid's edge, one more rate a factor of 2 past it (up to ``MAX_EXTEND`` times: a grid must bracket
the optimum), then runs ``--seeds`` seeds at its best rate. Reported: final test accuracy (mean
and spread over seeds) and the training time to 88%. Also LARS under sync-easgd and async-easgd
at 4096 (2 workers x 512 x accumulate 4), a combination no published system offers, with a rate
tuned the same way for an elastic worker (seed 0), then ``--seeds`` seeds at it. Every run is
appended to ``--cells`` as it finishes; ``--reuse`` reads finished runs back instead of running
them again, and ``--offline`` builds the table from the file alone (runs made on another machine,
e.g. a GPU, labelled with the machines the table's runs were made on).
On a machine with a GPU the runs train there (one worker: ``backend auto`` picks NCCL).

Part ``precision``. fp32, bf16 and fp16 under sync-sgd, 2 CPU workers (``--device cuda``: one
worker per GPU over NCCL), global batch ``--batch``, LeNet-5 (1 epoch) and the 4.8M-parameter CNN
(``--cnn-steps`` steps; an epoch on GPUs), taking turns (``--repeats`` rounds, the order rotated):
training samples/s (start-up and the one evaluation at the end excluded) and final accuracy side
by side. GPU results are named by the GPU (``benchmarks/gpu_checks.sh`` runs them with the CUDA
tests).

    .venv/bin/python benchmarks/bench_large_batch.py --part batches      # ~80 min on 2 cores
    .venv/bin/python benchmarks/bench_large_batch.py --part precision    # ~10 min
    python benchmarks/bench_large_batch.py --part precision --device cuda   # ~4 min on an H100
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from _common import RESULTS, machine, write_part_result

BASE_BATCH, MICRO_BATCH, TARGET = 256, 512, 0.88
MODELS = {
    "lenet5-bn": "LeNet-5 (batch norm)",
    "cnn": "4.8M-parameter CNN (no batch norm)",
}  # --model: title
TRAIN_SAMPLES = 60_000  # Fashion-MNIST's training set
EVALUATIONS = 20  # per run: every half epoch or so (the default, four per epoch and at least one
# per step, evaluated every step at 8192, where an epoch is 7 steps)
OPTIMIZERS = ("momentum", "nesterov", "lars", "lamb")
GRID = (0.5, 1.0, 2.0)  # multiples of a cell's starting rate tried at seed 0
EASGD_GRID = (0.25, 0.5, 1.0)  # multiples of half the one-process LARS rate (an elastic worker)
MAX_EXTEND = 3  # rates tried past a grid's edge while the best stays at the edge
NOT_RUN = "not in --cells"  # what --offline answers for a run the file does not hold


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
    steps = args.epochs * (TRAIN_SAMPLES // batch)
    options: dict[str, Any] = {
        "eval_every": max(1, steps // EVALUATIONS),
        "batch_size": micro,
        "accumulate": batch // micro,
        "epochs": args.epochs,
        "warmup_epochs": args.warmup_epochs if batch > BASE_BATCH else 0.0,
        "momentum": 0.9,
        "lr": lr,
    }
    if args.model != "lenet5-bn":  # in the run's key too (LeNet-5's runs predate --model)
        options["model"] = args.model
    if args.trust_exclude != "bias-norm" and optimizer in ("lars", "lamb"):  # likewise
        options["trust_exclude"] = args.trust_exclude
    if optimizer == "momentum":
        options.update(optimizer="sgd", lr=0.05, lr_base_batch=BASE_BATCH, weight_decay=5e-4)
    elif optimizer == "nesterov":
        options.update(optimizer="sgd", nesterov=True, lr_schedule="cosine", weight_decay=5e-4)
    elif optimizer == "lars":
        options.update(optimizer="lars", lr_schedule="poly", weight_decay=5e-4)
    else:
        options.update(optimizer="lamb", lr_schedule="poly", weight_decay=0.01)
    return options


def _cells(text: str) -> tuple[tuple[str, int], ...]:
    cells = []
    for item in filter(None, text.split(",")):
        optimizer, _, batch = item.partition(":")
        if optimizer not in OPTIMIZERS or not batch.isdigit():
            raise argparse.ArgumentTypeError(
                f"expected optimizer:batch like lars:8192, got {item!r}"
            )
        cells.append((optimizer, int(batch)))
    return tuple(cells)


def _rates(text: str) -> dict[str, float]:
    """``optimizer=lr`` (every batch of that optimizer) or ``optimizer:batch=lr`` (one cell)."""
    rates = {}
    for item in filter(None, text.split(",")):
        where, _, lr = item.partition("=")
        optimizer, _, batch = where.partition(":")
        try:
            rates[where] = float(lr)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected optimizer=lr or optimizer:batch=lr like lars:8192=32, got {item!r}"
            ) from None
        if optimizer not in OPTIMIZERS or (":" in where and not batch.isdigit()):
            raise argparse.ArgumentTypeError(f"unknown cell {where!r} in {item!r}")
        if optimizer == "momentum":
            raise argparse.ArgumentTypeError(
                f"momentum takes the linear scaling rule's rate, not a starting rate: {item!r}"
            )
    return rates


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


class Runs:
    """Every ``tether.fit`` of part batches, at most ``parallel`` at a time, each appended to a
    JSON-lines file as it finishes; with ``reuse`` a run already in the file (same settings) is
    read back instead of run again, so an interrupted sweep loses nothing."""

    def __init__(
        self, cells: Path, scratch: Path, parallel: int, reuse: bool, offline: bool = False
    ) -> None:
        self.cells, self.scratch, self.parallel, self.offline = cells, scratch, parallel, offline
        self.gate = threading.Semaphore(parallel)
        self.lock = threading.Lock()
        self.done: dict[str, dict[str, Any]] = {}
        self.found = 0  # runs read back from the file
        self.machine = machine()  # recorded with every run
        self.made_on: dict[str, dict[str, str] | None] = {}  # a run read back: its machine
        self.used: set[str] = set()  # the runs read back that the table shows
        if reuse and cells.exists():
            for line in filter(None, cells.read_text().splitlines()):
                entry = json.loads(line)
                self.done[entry["key"]] = entry["result"]
                self.made_on[entry["key"]] = entry.get("machine")

    def fit(self, options: dict[str, Any], method: str = "sync-sgd", workers: int = 1) -> dict:
        if self.parallel > 1:  # one thread per run: two runs of two threads on 2 cores thrash
            options = {**options, "threads_per_worker": 1}
        key = _run_key(method, workers, options)
        recorded = self._read_back(key)
        if recorded is not None:
            return recorded
        if self.offline:  # a table from the file alone (e.g. runs made on another machine):
            # also a run of a sweep with the other --parallel setting (the key holds
            # threads_per_worker only where runs went side by side)
            other = dict(options)
            if other.pop("threads_per_worker", None) is None:
                other["threads_per_worker"] = 1
            return self._read_back(_run_key(method, workers, other)) or {"error": NOT_RUN}
        with self.gate:
            name = f"{method}-{workers}-{abs(hash(key)):x}"
            record = run_fit(options, self.scratch / name, method, workers)
        with self.lock:
            self.done[key] = record
            with self.cells.open("a") as handle:
                entry = {"key": key, "result": record, "machine": self.machine}
                handle.write(json.dumps(entry) + "\n")
        return record

    def other_rates(self, options: dict[str, Any]) -> dict[float, dict[str, Any]]:
        """The runs in the file with these settings at any rate (``--offline``: a table from
        several sweeps lists every rate they tried, e.g. a grid moved after a first one failed)."""
        if self.parallel > 1:
            options = {**options, "threads_per_worker": 1}
        wanted = {
            k: v for k, v in json.loads(_run_key("sync-sgd", 1, options)).items() if k != "lr"
        }
        with self.lock:
            found = {
                key: (entry["lr"], record)
                for key, entry, record in ((k, json.loads(k), r) for k, r in self.done.items())
                if {k: v for k, v in entry.items() if k != "lr"} == wanted
            }
            self.used.update(found)
            return dict(found.values())

    def _read_back(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            if key not in self.done:
                return None
            self.found += 1
            self.used.add(key)
            return self.done[key]

    def machines_used(self) -> list[dict[str, str]]:
        """The machine of each run read back that the table shows, in the file's order; exits in
        one line where such a run does not record its machine."""
        machines = []
        for key, made_on in self.made_on.items():
            if key not in self.used:
                continue
            if made_on is None:
                raise SystemExit(
                    f"--offline: {self.cells} has runs that do not record their machine (written "
                    "before runs did); the table could not say where it was measured"
                )
            machines.append({k: v for k, v in made_on.items() if k != "host"})
        return machines


def _run_key(method: str, workers: int, options: dict[str, Any]) -> str:
    return json.dumps({"method": method, "workers": workers, **options}, sort_keys=True)


def merged_machine(machines: list[dict[str, str]]) -> dict[str, str]:
    """The label of a table built from runs made on ``machines`` (one per run; two leases of the
    same kind of machine are one machine here): a field the machines share is given once, one
    that differs lists each value in the runs' order (so the result file's name stays put as runs
    are appended), and ``runs`` says how many runs each machine made. A lent GPU machine is an
    H100 one session and an H200 the next, and a table's seeds may span both."""
    counts: dict[str, int] = {}
    for made_on in machines:
        seen = json.dumps(made_on, sort_keys=True)
        counts[seen] = counts.get(seen, 0) + 1
    distinct = [json.loads(seen) for seen in counts]
    if len(distinct) == 1:
        return distinct[0]
    merged = {
        field: " / ".join(dict.fromkeys(m.get(field, "none") for m in distinct))
        for field in dict.fromkeys(f for m in distinct for f in m)
    }
    merged["runs"] = ", ".join(
        f"{n} on {m.get('gpu', m['cpu'])}" for m, n in zip(distinct, counts.values(), strict=True)
    )
    return merged


def tune(
    run: Callable[[float], dict[str, Any]], start: float, multiples: tuple[float, ...]
) -> dict[float, dict[str, Any]]:
    """Seed 0 over ``start`` times each multiple (side by side), then, while the best final
    accuracy sits at an end of what was tried, one more rate a factor of 2 past that end (at
    most ``MAX_EXTEND`` times): a grid whose best is at its edge has not bracketed the optimum."""
    rates = [m * start for m in multiples]
    with ThreadPoolExecutor(max_workers=len(multiples)) as pool:
        tried = dict(zip(rates, pool.map(run, rates), strict=True))
    for _ in range(MAX_EXTEND):
        ok = {lr: r["accuracy"] for lr, r in tried.items() if r.get("accuracy") is not None}
        if not ok:
            break
        best = max(ok, key=lambda lr: ok[lr])
        if best == min(tried):
            tried[best / 2] = run(best / 2)
        elif best == max(tried):
            tried[best * 2] = run(best * 2)
        else:
            break
    return tried


def seeds_summary(runs: list[dict[str, Any]], seeds: int) -> str:
    """Mean final accuracy with its spread over the runs that finished (and how many did)."""
    accuracies = [r["accuracy"] for r in runs if r.get("accuracy") is not None]
    if not accuracies:
        return "failed"
    spread = f" ({min(accuracies):.2%}-{max(accuracies):.2%})" if len(accuracies) > 1 else ""
    return f"{statistics.mean(accuracies):.2%}{spread} [{len(accuracies)} of {seeds} seeds]"


def best_rate(tried: dict[float, dict[str, Any]]) -> float:
    ok = {lr: r for lr, r in tried.items() if r.get("accuracy") is not None}
    return max(ok, key=lambda v: ok[v]["accuracy"]) if ok else next(iter(tried))


def part_batches(
    args: argparse.Namespace, scratch: Path
) -> tuple[list[str], Figure, dict[str, str] | None]:
    batches = [int(b) for b in args.batches.split(",")]
    runs = Runs(args.cells, scratch, args.parallel, args.reuse or args.offline, args.offline)
    easgd_runs = Runs(args.cells, scratch, 1, args.reuse or args.offline, args.offline)

    def job(optimizer: str, batch: int, lr: float, seed: int) -> dict[str, Any]:
        record = runs.fit({**cell_options(optimizer, batch, lr, args), "seed": seed})
        print(f"  {optimizer:9} B={batch:<6} lr={lr:<8.4g} seed {seed}: {record}", flush=True)
        return record

    def cell_runs(o: str, b: int) -> dict[str, Any]:
        """Tune at seed 0 (momentum takes the rule's rate), then the other seeds side by side at
        the best rate; a thread per run, the gate keeps ``--parallel`` runs going."""
        start = args.start_lr.get(f"{o}:{b}", args.start_lr.get(o, starting_lr(o, b)))
        if o == "momentum":
            tried = {start: job(o, b, start, 0)}
        else:
            tried = tune(lambda lr: job(o, b, lr, 0), start, GRID)
            if args.offline:
                options = {**cell_options(o, b, start, args), "seed": 0}
                tried = {**runs.other_rates(options), **tried}
        lr = best_rate(tried)
        with ThreadPoolExecutor(max_workers=max(1, args.seeds - 1)) as pool:  # the gate limits
            seeds = list(pool.map(lambda seed: job(o, b, lr, seed), range(1, args.seeds)))
        return {"lr": lr, "runs": [tried[lr], *seeds], "grid": tried}

    cells = [(o, b) for b in batches for o in OPTIMIZERS if not args.only or (o, b) in args.only]
    with ThreadPoolExecutor(max_workers=len(cells)) as pool:
        results = dict(zip(cells, pool.map(lambda c: cell_runs(*c), cells), strict=True))

    # LARS under the EASGD methods at 4096, 2 workers x 512 x 4, one run at a time (each is two
    # worker processes). An elastic worker's own update covers its batch of 2048 and is then
    # pulled toward the center, so the rate is tuned for it, from half the one-process rate.
    # Seed 0 tunes the rate (its key holds no seed, as the runs before seeds were added), then
    # the other ``--seeds`` run at the best rate.
    easgd: dict[str, dict[float, dict[str, Any]]] = {}
    easgd_seeds: dict[str, list[dict[str, Any]]] = {}
    lars_4096 = results.get(("lars", 4096), {}).get("lr", starting_lr("lars", 4096))
    for method in ("sync-easgd", "async-easgd") if args.elastic else ():

        def elastic(lr: float, method: str = method, seed: int = 0) -> dict[str, Any]:
            options = {**cell_options("lars", 4096, lr, args), "batch_size": 512, "accumulate": 4}
            if seed:
                options["seed"] = seed
            record = easgd_runs.fit(options, method=method, workers=2)
            print(f"  lars under {method} at 4096, lr {lr:g}, seed {seed}: {record}", flush=True)
            return record

        easgd[method] = tune(elastic, lars_4096 / 2, EASGD_GRID)
        best = best_rate(easgd[method])
        easgd_seeds[method] = [easgd[method][best]] + [
            elastic(best, seed=seed) for seed in range(1, args.seeds)
        ]

    if args.offline and runs.found + easgd_runs.found == 0:
        raise SystemExit(
            f"--offline: no run in {args.cells} has these settings; give --epochs, "
            "--warmup-epochs, --batches and --start-lr as the sweep had them"
        )

    def cell(o: str, b: int) -> str:
        if (o, b) not in results or all(
            r.get("error") == NOT_RUN for r in results[(o, b)]["grid"].values()
        ):
            return "not run"
        finished = [r for r in results[(o, b)]["runs"] if r.get("accuracy") is not None]
        if not finished:
            return "failed"
        accuracies = [r["accuracy"] for r in finished]
        times = [r["time_to_target_s"] for r in finished if r["time_to_target_s"] is not None]
        spread = f" ({min(accuracies):.2%}-{max(accuracies):.2%})" if len(finished) > 1 else ""
        tta = f"{statistics.median(times):.0f} s" if times else "not reached"
        reached = f" [{len(times)}/{len(finished)}]" if len(finished) > 1 else ""
        if len(finished) < args.seeds:  # an interrupted or partly recovered sweep
            reached += f"; {len(finished)} of {args.seeds} seeds"
        return f"{statistics.mean(accuracies):.2%}{spread}; 88%: {tta}{reached}; lr {results[(o, b)]['lr']:.3g}"

    lines = [
        f"| global batch | {' | '.join(OPTIMIZERS)} |",
        "|---|" + "---|" * len(OPTIMIZERS),
    ]
    for b in batches:
        lines.append(f"| {b} | " + " | ".join(cell(o, b) for o in OPTIMIZERS) + " |")
    if any(r.get("error") != NOT_RUN for tried in easgd.values() for r in tried.values()):
        lines += [
            "",
            "LARS under the elastic methods at 4096 (2 workers x 512 x accumulate 4, the rate tuned"
            " for them at seed 0, then the other seeds at it; one-process LARS at 4096 is in the"
            " table above):",
            "",
            "| method | final accuracy at the best rate (mean, spread over seeds) "
            "| rates tried at seed 0 (lr: final accuracy, best first) |",
            "|---|---|---|",
        ]
    for method, tried in easgd.items():
        if all(r.get("error") == NOT_RUN for r in tried.values()):
            continue
        ranked = sorted(tried.items(), key=lambda kv: -(kv[1].get("accuracy") or 0.0))
        lines.append(
            f"| {method} | {seeds_summary(easgd_seeds[method], args.seeds)} | "
            + ", ".join(
                f"{lr:g}: {r['accuracy']:.2%}"
                if r.get("accuracy") is not None
                else f"{lr:g}: failed"
                for lr, r in ranked
                if r.get("error") != NOT_RUN
            )
            + " |"
        )
    lines += ["", "Seed-0 grids (lr: final accuracy):", ""]
    for (o, b), cell_result in sorted(results.items()):
        if cell(o, b) == "not run":
            continue
        grid = ", ".join(
            f"{lr:.3g}: {r['accuracy']:.2%}"
            if r.get("accuracy") is not None
            else f"{lr:.3g}: failed"
            for lr, r in sorted(cell_result["grid"].items())
            if r.get("error") != NOT_RUN
        )
        lines.append(f"- {o} at {b}: {grid}")

    figure = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot(1, 1, 1)
    for o in OPTIMIZERS:
        means = []
        for b in batches:
            runs_ob = results.get((o, b), {}).get("runs", [])
            accs = [r["accuracy"] for r in runs_ob if r.get("accuracy") is not None]
            means.append(statistics.mean(accs) if accs else float("nan"))
        ax.plot(batches, means, marker="o", label=o)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch")
    ax.set_ylabel(f"test accuracy after {args.epochs} epochs")
    ax.set_title(f"{MODELS[args.model]}, Fashion-MNIST")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if not args.offline:  # made here, now
        return lines, figure, None
    return lines, figure, merged_machine(runs.machines_used() + easgd_runs.machines_used())


def training_rate(summary: dict[str, Any]) -> float:
    """Samples per second of training: every worker's samples over the training time of the
    last history entry (start-up and evaluation excluded)."""
    seconds = summary["history"][-1]["time_s"]
    return summary["steps"] * summary["global_batch_size"] / max(seconds, 1e-9)


def part_precision(
    args: argparse.Namespace, scratch: Path
) -> tuple[list[str], Figure, dict[str, str] | None]:
    precisions = ("fp32", "bf16", "fp16")
    # One evaluation, at the end; the rate is over training time (evaluation pauses excluded).
    models = {
        "lenet5": {"epochs": 1, "eval_every": 10**6},
        "cnn": {"steps": args.cnn_steps, "eval_every": 10**6},
    }
    # The same global batch (--batch, 128 by default) and rate on either device: 2 CPU workers,
    # or one worker per GPU (NCCL). A GPU runs the CNN's whole epoch in the time the CPU runs a
    # few steps.
    workers = torch.cuda.device_count() if args.device == "cuda" else 2
    if workers == 0:
        raise SystemExit("--device cuda needs a visible CUDA device")
    if args.batch % workers:
        raise SystemExit(f"--batch {args.batch} must split over {workers} worker(s) (a GPU each)")
    placement: dict[str, Any] = {"workers": workers, "batch_size": args.batch // workers}
    if args.device == "cuda":
        placement["backend"] = "nccl"
        models["cnn"] = {"epochs": 1, "eval_every": 10**6}
    rates: dict[tuple[str, str], list[float]] = {}
    accuracy: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats):
        for name, length in models.items():
            order = precisions[r % 3 :] + precisions[: r % 3]
            for precision in order:
                out = scratch / f"{name}-{precision}-{r}"
                spec = {"model": name, "train_data": "fashion-mnist", "method": "sync-sgd",
                        "lr": 0.05, "precision": precision, "out": str(out), **placement,
                        **length}  # fmt: skip
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
        where = f"{workers} CPU workers" if args.device == "cpu" else f"{workers} GPU(s)"
        ax.set_ylabel(f"samples/s (sync-sgd, {where}, batch {args.batch})")
    figure.tight_layout()
    return lines, figure, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("batches", "precision"), required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--warmup-epochs", type=float, default=2.0)
    parser.add_argument("--batches", default="256,4096,8192")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--model", choices=tuple(MODELS), default="lenet5-bn", help="part batches: the model"
    )
    parser.add_argument(
        "--trust-exclude",
        choices=("bias-norm", "none"),
        default="bias-norm",
        help="part batches: LARS's and LAMB's exclusion rule (none: every tensor takes the ratio)",
    )
    parser.add_argument("--parallel", type=int, default=2, help="runs side by side (part batches)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds (part precision)")
    parser.add_argument("--cnn-steps", type=int, default=60, help="the CNN's steps on the CPU")
    parser.add_argument("--batch", type=int, default=128, help="part precision's global batch")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="part precision: 2 CPU workers, or one worker per GPU (NCCL; the CNN for an epoch)",
    )
    parser.add_argument(
        "--cells",
        type=Path,
        default=RESULTS / "large_batch_batches_cells.jsonl",
        help="JSON-lines file every run of part batches is appended to",
    )
    parser.add_argument("--reuse", action="store_true", help="read runs already in --cells back")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="part batches: the table from --cells alone, running nothing (a run missing there "
        "is left out and its cell says so), labelled with the machine the runs recorded",
    )
    parser.add_argument(
        "--only",
        type=_cells,
        default=(),
        help="part batches: only these cells, as optimizer:batch,... (e.g. momentum:256,lars:8192)",
    )
    parser.add_argument(
        "--start-lr",
        type=_rates,
        default={},
        help="part batches: a starting rate instead of the rule's, as optimizer=lr (every batch) "
        "or optimizer:batch=lr (one cell), comma-separated (a tuned grid is centred there)",
    )
    parser.add_argument(
        "--no-elastic",
        dest="elastic",
        action="store_false",
        help="part batches: leave out LARS under sync-easgd and async-easgd",
    )
    parser.add_argument("--stem", help="the result file's name (default: large_batch_PART)")
    args = parser.parse_args()
    if args.offline and args.part != "batches":
        parser.error("--offline builds part batches' table; part precision has no runs file")
    if args.offline and not (args.cells.exists() and args.cells.read_text().strip()):
        parser.error(f"--offline: no runs in {args.cells}; pass the runs file with --cells FILE")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tether-large-batch-") as scratch:
        part = part_batches if args.part == "batches" else part_precision
        # an --offline table is labelled with the machines its runs were made on
        lines, figure, made_on = part(args, Path(scratch))
    write_part_result(
        f"Large-batch training: part {args.part}",
        args.stem or f"large_batch_{args.part}",
        lines,
        figure,
        made_on or machine(),
        started,
    )


if __name__ == "__main__":
    main()
