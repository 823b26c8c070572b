"""Samples of a model's compute for ``tether calibrate``: the step layer by layer, the training
loop around it, and how much a busy node slows a worker.

A shared machine's speed drifts over tens of seconds, so one timing may stand for an unusual
moment; the calibration takes several samples spread over its other measurements and keeps the
median (:class:`ComputeSamples`). The loops are timed by a :class:`LoopTimer`:
:class:`TrainerLoops` runs ``tether train``; a caller with its own trainer (the benchmark that
validates the performance model runs ``tether.fit``) passes its own timer and gets the same
sampling.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tether.errors import TetherError
from tether.perf.profile import Sourced
from tether.perf.workload import Workload


def median_sample(samples: list[tuple[Workload, float]]) -> tuple[Workload, float]:
    """Of several timings of the same step (``(workload, seconds)``), the one of median total
    time (the lower middle one of an even count): a whole timing, so its layers stay
    consistent with each other."""
    if not samples:
        raise TetherError("no timing of the model's step to choose from")
    ordered = sorted(samples, key=lambda sample: sample[1])
    return ordered[(len(ordered) - 1) // 2]


@dataclass(frozen=True)
class LoopTimes:
    """Seconds per step of a training loop: all of it (rank 0's training clock), and of that the
    model's own compute (forward, backward, update: the metrics' ``compute_s``)."""

    step_s: float
    compute_s: float


class LoopTimer(Protocol):
    """Times the training loop of the model being calibrated."""

    def one_worker(self) -> LoopTimes:
        """One worker of sync-sgd: the loop a calibration point stands for."""
        ...

    def quiet(self, workers: int) -> LoopTimes:
        """``workers`` local workers that never communicate (local-sgd with a period longer
        than the run: no all-reduce, no gradient hooks), each core busy with its own loop."""
        ...

    def exchanging(self, workers: int, bucket_mb: float) -> LoopTimes:
        """``workers`` local workers of sync-sgd without overlap, fusing gradients into buckets
        of ``bucket_mb`` (0: a message per tensor): the exchange under load
        (:mod:`tether.bench.exchange_load`)."""
        ...

    def serving(self, workers: int) -> LoopTimes:
        """``workers`` local workers of async-sgd and their parameter server."""
        ...


@dataclass(frozen=True)
class TrainerLoops:
    """:class:`LoopTimer` through ``tether train train_argv`` in a subprocess, timed between
    steps ``short`` and ``long`` of one run, so that start-up, the first steps' warm-up and the
    final evaluation are left out."""

    train_argv: list[str]
    short: int
    long: int

    def one_worker(self) -> LoopTimes:
        return self._run(["--workers", "1", "--method", "sync-sgd"])

    def quiet(self, workers: int) -> LoopTimes:
        tau = str(self.long + 1)
        return self._run(["--workers", str(workers), "--method", "local-sgd", "--tau", tau])

    def exchanging(self, workers: int, bucket_mb: float) -> LoopTimes:
        placement = ["--workers", str(workers), "--method", "sync-sgd"]
        return self._run([*placement, "--set", f"bucket_mb={bucket_mb}", "--set", "overlap=false"])

    def serving(self, workers: int) -> LoopTimes:
        return self._run(["--workers", str(workers), "--method", "async-sgd"])

    def _run(self, placement: list[str]) -> LoopTimes:
        with tempfile.TemporaryDirectory(prefix="tether-calibrate-") as scratch:
            out = Path(scratch) / "train"
            command = [sys.executable, "-m", "tether", "train", *self.train_argv, *placement]
            command += ["--steps", str(self.long), "--eval-every", "1000000000"]
            result = subprocess.run(
                [*command, "--no-progress", "--out", str(out)], capture_output=True, text=True
            )
            if result.returncode != 0:
                lines = (result.stderr or "").strip().splitlines()
                message = lines[-1] if lines else "no message"
                raise TetherError(f"timing the trainer failed: {message}")
            metrics = (out / "metrics.jsonl").read_text()
        return loop_times_from_metrics(metrics, self.short, self.long)


def loop_times_from_metrics(metrics: str, short: int, long: int) -> LoopTimes:
    """Seconds per step between steps ``short`` and ``long`` from rank 0's metrics lines: the
    training clock's difference, and the mean of the steps' ``compute_s``. An asynchronous
    run's lines are its server's, one per worker's step (``worker``, ``worker_step``): the
    first worker's local steps are timed (no compute split there: 0)."""
    entries = [json.loads(line) for line in metrics.splitlines()]
    entries = [entry for entry in entries if "time_s" in entry and "loss" in entry]
    workers = {entry["worker"] for entry in entries if "worker" in entry}
    if workers:
        first = min(workers)
        entries = [
            {**entry, "step": entry["worker_step"]}
            for entry in entries
            if entry.get("worker") == first and "worker_step" in entry
        ]
    clock, compute = {}, []
    for entry in entries:
        if entry.get("step") in (short, long):
            clock[entry["step"]] = float(entry["time_s"])
        if short < entry.get("step", 0) <= long and "compute_s" in entry:
            compute.append(float(entry["compute_s"]))
    if short not in clock or long not in clock:
        raise TetherError(f"the trainer's metrics lack step {short} or {long}: no loop to time")
    return LoopTimes(
        max(0.0, (clock[long] - clock[short]) / (long - short)),
        statistics.mean(compute) if compute else 0.0,
    )


def busy_node_slowdown(single: list[float], busy: list[float], workers: int, when: str) -> Sourced:
    """The profile's ``busy_node_slowdown``: the median over paired samples of a worker's
    compute per step (forward, backward, update) on a busy node over one worker's alone, at
    least 1. Each busy-node sample is taken right after its one-worker sample, so the machine's
    drift cancels in the pair."""
    ratios = [b / s for s, b in zip(single, busy, strict=True) if s > 0]
    if not ratios:
        raise TetherError("no one-worker step time to compare the busy node's with")
    return Sourced(
        max(1.0, statistics.median(ratios)),
        f"{when}: a worker's compute per step on {workers} workers that do not communicate "
        f"(every core busy) over one worker's, median of {len(ratios)} pairs "
        f"({min(ratios):.3f}-{max(ratios):.3f})",
    )


@dataclass
class ComputeSamples:
    """Samples of the model's step (layer by layer, ``time_layers``), of the training loop on one
    worker, and of a pair of loops that never communicate, on one worker and on ``node_workers``
    (every core busy; no pair when the node has one core). Taken between a calibration's other
    measurements, the median of samples spread over it stands for the machine's typical speed.
    The pair's two runs follow each other, so that they see the same machine."""

    time_layers: Callable[[], tuple[Workload, float]]
    loops: LoopTimer
    node_workers: int
    layers: list[tuple[Workload, float]] = field(default_factory=list)
    single: list[LoopTimes] = field(default_factory=list)
    alone: list[LoopTimes] = field(default_factory=list)  # the pair: one worker...
    busy: list[LoopTimes] = field(default_factory=list)  # ...and node_workers

    def take(self) -> None:
        self.layers.append(self.time_layers())
        self.single.append(self.loops.one_worker())
        if self.node_workers > 1:
            self.alone.append(self.loops.quiet(1))
            self.busy.append(self.loops.quiet(self.node_workers))

    def loop_steps_s(self) -> list[float]:
        return [times.step_s for times in self.single]

    def workload(self) -> tuple[Workload, float]:
        """The median timing of the model's step, with what the median training loop adds to it
        (the batch, bookkeeping, the metrics line) as its ``data_s``; and the step's seconds."""
        workload, step_s = median_sample(self.layers)
        loop_s = statistics.median(self.loop_steps_s())
        return dataclasses.replace(workload, data_s=max(0.0, loop_s - step_s)), step_s

    def busy_node_slowdown(self, when: str) -> Sourced | None:
        if not self.busy:
            return None
        alone = [times.compute_s for times in self.alone]
        busy = [times.compute_s for times in self.busy]
        return busy_node_slowdown(alone, busy, self.node_workers, when)

    def to_dict(self) -> dict[str, list[float]]:
        """Every sample, in the order taken: the spread says how steady the machine was."""
        return {
            "model_step_s": [step for _, step in self.layers],
            "training_loop_step_s": self.loop_steps_s(),
            "one_worker_compute_s": [times.compute_s for times in self.alone],
            "busy_node_compute_s": [times.compute_s for times in self.busy],
        }
