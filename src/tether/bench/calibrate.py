"""``tether calibrate``: measure the running machine into a hardware profile and a model's layers
into a workload, for ``tether predict`` (:mod:`tether.perf`).

The links: ``tether bench comm``'s ranks time the backend's own all-reduce (``native``, what
training uses unless told otherwise) at a range of sizes on ``workers`` local ranks, and the
profile's alpha and beta are the least-squares fit of the ring formula
``2(P-1)a + 2(P-1)/P*n*b`` to those times (Hockney's model fitted as MG-WFBP fits its clusters);
gamma is the calibration's in-place add (:func:`~tether.comm.calibration.measure.measure_gamma`),
timed here on the workers' thread count. The compute: the model's
training step timed layer by layer (:mod:`tether.bench.workload`); the profile's achieved FLOP/s is
that step's counted FLOPs (3x forward) over its time, which predicts other models of similar
shape where they were not timed; the training loop's own cost and the slowdown of a worker on a
busy node from short training runs (:class:`ComputeSamples`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import socket
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tether.bench.link_fit import fit_ring
from tether.bench.server_wire import WireFit, measure_server_wire
from tether.bench.workload import measure_workload
from tether.errors import TetherError
from tether.launch.partition import usable_cores
from tether.perf.profile import HardwareProfile, Link, Sourced
from tether.perf.workload import Workload

LINK_SIZES = ("4KB", "64KB", "256KB", "1MB", "4MB", "16MB")  # KB, MB: powers of 1024
ONE_NODE = 64  # local ranks: every worker of a local run shares this node


@dataclass(frozen=True)
class LinkFit:
    alpha: float
    beta: float
    gamma: float
    workers: int
    points: list[tuple[float, float]]  # (bytes, seconds) of native all-reduce
    when: str


def measure_links(workers: int, threads: int, timeout_s: float) -> LinkFit:
    """Time native all-reduce on ``workers`` local ranks (tether bench comm's ranks) and fit;
    gamma is timed in this process on ``threads`` threads, a worker's."""
    from tether.bench.comm_launch import launch_torch
    from tether.comm.calibration.measure import measure_gamma

    if workers < 2:
        raise TetherError("--workers must be at least 2 to measure the links")
    with tempfile.TemporaryDirectory(prefix="tether-calibrate-") as tmp:
        out = Path(tmp) / "comm.json"
        argv = ["--op", "allreduce", "--algo", "native", "--sizes", ",".join(LINK_SIZES)]
        # No predictions: they need the collectives' calibration (tens of seconds on a
        # machine that has none), and the fit below is all this needs.
        argv += ["--repeats", "10", "--timeout", str(timeout_s), "--no-predict"]
        launch_torch(workers, [*argv, "--out", str(out)], timeout_s, Path(tmp))
        report = json.loads(out.read_text())
    points = [(float(r["bytes"]), float(r["time_s"])) for r in report["rows"]]
    alpha, beta = fit_ring(points, workers)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gamma = measure_gamma()
    finally:
        torch.set_num_threads(before)
    return LinkFit(alpha, beta, gamma, workers, points, report["date"])


def hardware_profile(
    name: str,
    links: LinkFit,
    workload: Workload,
    step_s: float,
    threads: int,
    wire: WireFit | None = None,
    busy: Sourced | None = None,
) -> HardwareProfile:
    """The running machine as a profile: one node holding every local worker, its usable cores,
    the fitted links (and the parameter server's wire, ``wire``), the achieved FLOP/s of the
    timed model and how much a busy node slows a worker (``busy``)."""
    where = f"tether calibrate on {socket.gethostname()}, {links.when}"
    fit = (
        f"{where}: ring formula fitted to native all-reduce times on {links.workers} ranks "
        f"at {', '.join(LINK_SIZES)}"
    )
    cores = len(usable_cores())
    flops = 3 * workload.forward_flops / step_s if step_s > 0 else 0.0
    if flops <= 0:
        raise TetherError(
            f"torch counted no FLOPs in model {workload.model!r} (no convolution or matrix "
            "product?): the profile's achieved FLOP/s cannot be measured with it"
        )
    link = Link(Sourced(links.alpha, fit), Sourced(links.beta, fit))
    server_wire = None
    if wire is not None:
        sizes = ", ".join(
            f"{n / 2**20:.0f}MB" if n >= 2**20 else f"{n / 1024:.0f}KB" for n, _ in wire.points
        )
        wire_fit = f"{where}: t = 2(a + n*b) fitted to socket-wire round trips at {sizes}"
        server_wire = Link(Sourced(wire.alpha, wire_fit), Sourced(wire.beta, wire_fit))
    return HardwareProfile(
        name=name,
        description=f"{socket.gethostname()}: {cores} usable cores, every worker on this node, "
        f"{threads} thread(s) per worker",
        ranks_per_node=ONE_NODE,
        cores_per_node=max(1, cores // max(1, threads)),
        intra=link,
        inter=link,
        gamma=Sourced(links.gamma, f"{where}: in-place add of 4 MiB float32"),
        flops=Sourced(
            flops,
            f"{where}: {workload.model} at batch {workload.batch_size}, 3x forward FLOPs "
            "(torch's count) over the timed training step",
        ),
        server_wire=server_wire,
        busy_node_slowdown=busy,
    )


def time_model(
    model: nn.Module,
    inputs: Any,
    targets: Any,
    loss: Any,
    optimizer: torch.optim.Optimizer,
    name: str,
    profile_name: str,
    threads: int,
    repeats: int = 20,
) -> tuple[Workload, float]:
    """The workload of one training step and its total seconds, timed on ``threads`` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        workload = measure_workload(
            model, inputs, targets, loss, optimizer, name, profile_name, repeats=repeats
        )
    finally:
        torch.set_num_threads(before)
    step = sum(layer.forward_s + layer.backward_s for layer in workload.layers)
    return workload, step + workload.update_s


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


def trainer_loop_times(
    train_argv: list[str], short: int, long: int, scratch: Path, workers: int = 0
) -> LoopTimes:
    """Seconds per step of ``tether train`` with ``train_argv``: with ``workers`` 0, one worker
    of sync-sgd (what a calibration point is); otherwise ``workers`` of local-sgd with a period
    longer than the run, which never communicate and add no gradient hooks to the backward
    pass. From one run of ``long`` steps: rank 0's metrics lines between steps ``short`` and
    ``long``, so that start-up, the first steps' warm-up and the final evaluation are left
    out."""
    import subprocess
    import sys

    out = scratch / f"train-{workers}"
    command = [sys.executable, "-m", "tether", "train", *train_argv]
    if workers == 0:
        command += ["--workers", "1", "--method", "sync-sgd"]
    else:
        command += ["--workers", str(workers), "--method", "local-sgd", "--tau", str(long + 1)]
    command += ["--steps", str(long), "--eval-every", "1000000000"]
    result = subprocess.run(
        [*command, "--no-progress", "--out", str(out)], capture_output=True, text=True
    )
    if result.returncode != 0:
        lines = (result.stderr or "").strip().splitlines()
        raise TetherError(f"timing the trainer failed: {lines[-1] if lines else 'no message'}")
    clock, compute = {}, []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if "time_s" not in entry or "loss" not in entry:
            continue
        if entry.get("step") in (short, long):
            clock[entry["step"]] = float(entry["time_s"])
        if short < entry.get("step", 0) <= long:
            compute.append(float(entry["compute_s"]))
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
    (every core busy; no pair when the node has one core), taken between a calibration's other
    measurements: a shared machine's speed drifts over tens of seconds, and the median of
    samples spread over the calibration stands for its typical speed where one sample may not.
    The pair's two runs follow each other, so that they see the same machine."""

    time_layers: Callable[[], tuple[Workload, float]]
    train_argv: list[str]
    steps: tuple[int, int]  # the training loop is timed between these two steps
    node_workers: int
    layers: list[tuple[Workload, float]] = field(default_factory=list)
    single: list[LoopTimes] = field(default_factory=list)
    alone: list[LoopTimes] = field(default_factory=list)  # the pair: one worker...
    busy: list[LoopTimes] = field(default_factory=list)  # ...and node_workers

    def take(self) -> None:
        self.layers.append(self.time_layers())
        with tempfile.TemporaryDirectory(prefix="tether-calibrate-") as scratch:
            self.single.append(trainer_loop_times(self.train_argv, *self.steps, Path(scratch)))
            if self.node_workers > 1:
                for workers, into in ((1, self.alone), (self.node_workers, self.busy)):
                    into.append(
                        trainer_loop_times(self.train_argv, *self.steps, Path(scratch), workers)
                    )

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


@dataclass(frozen=True)
class Calibration:
    profile: HardwareProfile
    workload: Workload  # the median timing, with the training loop's own cost as its data_s
    step_s: float  # the model's own step in that timing
    links: LinkFit
    wire: WireFit
    samples: ComputeSamples

    def extra(self) -> dict[str, Any]:
        """What the profile file keeps beside the profile: every measured point and sample."""
        return {
            "all_reduce_points": self.links.points,
            "server_wire_round_trips": self.wire.points,
            **self.samples.to_dict(),
        }


def calibrate_machine(
    name: str,
    what: str,
    time_layers: Callable[[], tuple[Workload, float]],
    train_argv: list[str],
    options: Any,
    say: Callable[[str], None],
) -> Calibration:
    """Measure the running machine in this order: a compute sample (:class:`ComputeSamples`),
    the links, another sample, the server's wire, the samples left (``options.loop_runs`` in
    all), so that the samples span the whole calibration. ``options`` holds ``tether
    calibrate``'s ``workers``, ``threads_per_worker``, ``loop_steps``, ``loop_runs`` and
    ``timeout``; ``say`` reports each step."""
    threads = max(1, options.threads_per_worker)
    samples = ComputeSamples(
        time_layers,
        train_argv,
        (10, 10 + options.loop_steps),
        min(ONE_NODE, len(usable_cores()) // threads),
    )

    def take_sample() -> None:
        pair = f" and on {samples.node_workers}" if samples.node_workers > 1 else ""
        say(
            f"timing {what} and the training loop on one worker{pair} "
            f"({len(samples.single) + 1} of {options.loop_runs})"
        )
        samples.take()

    take_sample()
    say(f"timing native all-reduce on {options.workers} local ranks (seconds)")
    links = measure_links(options.workers, threads, options.timeout)
    if len(samples.single) < options.loop_runs:
        take_sample()
    say("timing the parameter server's wire on 2 local ranks")
    wire = measure_server_wire(options.timeout)
    while len(samples.single) < options.loop_runs:
        take_sample()
    workload, step_s = samples.workload()
    busy = samples.busy_node_slowdown(links.when)
    profile = hardware_profile(name, links, workload, step_s, threads, wire, busy)
    return Calibration(profile, workload, step_s, links, wire, samples)


def write_calibration(
    path: Path, profile: HardwareProfile, workload: Workload, extra: dict
) -> None:
    """One JSON file: the hardware profile (``tether predict --profile FILE``) and the timed
    workload (used by predict for the same model and batch on this profile)."""
    from tether.observe.files import atomic_write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        path,
        {
            "hardware": profile.to_dict(),
            "workload": workload.to_dict(),
            "calibrated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **extra,
        },
    )
