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
busy node from short training runs, sampled over the calibration
(:mod:`tether.bench.compute_samples`); what an exchange costs in training beyond the idle links'
price from three more (:mod:`tether.bench.exchange_load`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import socket
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tether.bench.compute_samples import ComputeSamples, LoopTimer
from tether.bench.exchange_load import ExchangeSamples, fit_exchange_load
from tether.bench.link_fit import fit_ring
from tether.bench.server_wire import WireFit, measure_server_wire
from tether.bench.workload import measure_workload
from tether.errors import TetherError, first_line
from tether.launch.partition import usable_cores
from tether.perf.profile import HardwareProfile, Link, Sourced
from tether.perf.workload import Workload
from tether.spelling import Spell, as_dashed
from tether.training.objective import RegressionLoss

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
    measurements: int = 1  # each size's time is the median of this many spread-out measurements


def median_links(fits: list[LinkFit]) -> LinkFit:
    """Several measurements of the links as one: the ring fitted to each size's median time,
    gamma's median. A shared machine's all-reduce latency changes over seconds; one measurement
    taken in a fast or slow spell would set every prediction's communication."""
    if not fits:
        raise TetherError("no measurement of the links to combine")
    sizes = [n for n, _ in fits[0].points]
    if any([n for n, _ in fit.points] != sizes for fit in fits):
        raise TetherError("the links' measurements timed different sizes: they cannot combine")
    points = [(n, statistics.median(fit.points[i][1] for fit in fits)) for i, n in enumerate(sizes)]
    alpha, beta = fit_ring(points, fits[0].workers)
    gamma = statistics.median(fit.gamma for fit in fits)
    return LinkFit(alpha, beta, gamma, fits[0].workers, points, fits[0].when, len(fits))


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
        argv += ["--quiet"]  # the calibration says what it times in its own words
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
    medians = (
        f" (each the median of {links.measurements} measurements spread over the calibration)"
        if links.measurements > 1
        else ""
    )
    fit = (
        f"{where}: ring formula fitted to native all-reduce times on {links.workers} ranks "
        f"at {', '.join(LINK_SIZES)}{medians}"
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
        try:
            workload = measure_workload(
                model, inputs, targets, loss, optimizer, name, profile_name, repeats=repeats
            )
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            # the model, the loss and the data do not fit: one line, not a traceback
            why = _what_does_not_fit(model, inputs, targets, loss, exc)
            raise TetherError(f"timing {name}'s training step failed: {why}") from None
        # kept, so that a prediction for another thread count can say its times are not of it
        workload = dataclasses.replace(workload, threads=threads)
    finally:
        torch.set_num_threads(before)
    return workload, workload.timed_step_s


def _what_does_not_fit(
    model: nn.Module, inputs: Any, targets: Any, loss: Any, exc: BaseException
) -> str:
    """Which of the model and the data, or the loss and the outputs, failed the timed step:
    the forward alone, then the loss on its outputs, tried again untimed."""
    try:
        with torch.no_grad():
            outputs = model(inputs)
    except Exception as forward:
        return (
            f"the model does not take the data's inputs ({_shapes(inputs)}): "
            f"{first_line(forward)} (give the data it takes: --dataset module:loader, or the "
            "inputs in Python)"
        )
    try:
        loss(outputs, targets)
    except Exception as failed:
        return (
            f"{first_line(failed)} (does the loss fit the model's outputs ({_shapes(outputs)}) "
            f"and the data's targets ({_shapes(targets)})?{_loss_kind_hint(loss, targets)})"
        )
    return first_line(exc)


_REGRESSION_LOSSES = (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss)
_CLASSIFICATION_LOSSES = (F.cross_entropy, F.nll_loss)


def _loss_kind_hint(loss: Any, targets: Any) -> str:
    """A word where the loss is of the other kind than the targets (a regression loss on class
    indices, or the other way round); nothing where the kinds agree or are not known (a loss
    of the right kind failed for another reason, e.g. a class index out of range)."""
    if not isinstance(targets, torch.Tensor):
        return ""
    regression = isinstance(
        loss, nn.MSELoss | nn.L1Loss | nn.SmoothL1Loss | nn.HuberLoss | RegressionLoss
    )
    regression = regression or loss in _REGRESSION_LOSSES
    classification = (
        isinstance(loss, nn.CrossEntropyLoss | nn.NLLLoss) or loss in _CLASSIFICATION_LOSSES
    )
    if regression and not targets.is_floating_point():
        return (
            " class-index targets take a classification loss: --loss cross-entropy, "
            "loss='cross-entropy'"
        )
    if classification and targets.is_floating_point():
        return " a regression takes a regression loss: --loss mse, loss='mse'"
    return ""


def _shapes(value: Any) -> str:
    """``shape [64, 1, 28, 28]``, or the shapes of a tuple's, list's or dict's tensors."""
    if isinstance(value, torch.Tensor):
        return f"shape {list(value.shape)}"
    if isinstance(value, dict):
        return ", ".join(f"{key}: {_shapes(item)}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return "(" + ", ".join(_shapes(item) for item in value) + ")"
    return type(value).__name__


@dataclass(frozen=True)
class Calibration:
    profile: HardwareProfile
    workload: Workload  # the median timing, with the training loop's own cost as its data_s
    step_s: float  # the model's own step in that timing
    links: LinkFit  # the median of link_samples
    link_samples: list[LinkFit]
    wire: WireFit
    samples: ComputeSamples
    exchanges: ExchangeSamples

    def extra(self) -> dict[str, Any]:
        """What the profile file keeps beside the profile: every measured point and sample."""
        return {
            "all_reduce_points": self.links.points,
            "all_reduce_points_per_measurement": [fit.points for fit in self.link_samples],
            "server_wire_round_trips": self.wire.points,
            **self.samples.to_dict(),
            **self.exchanges.to_dict(),
        }


@dataclass(frozen=True)
class CalibrationOptions:
    """How a calibration samples: ranks for the links and the exchange (``workers``), a
    worker's threads, rounds of samples (``loop_runs``), each launch's ``timeout`` (s), and at
    most how many workers the busy-node runs start (``most_workers``: a small data set holds
    only so many global batches; else one per core)."""

    workers: int = 2
    threads_per_worker: int = 1
    loop_runs: int = 3
    timeout: float = 120.0
    most_workers: int = ONE_NODE

    def check(self, loop_steps: int, repeats: int, spell: Spell = as_dashed) -> None:
        """One-line errors for what would fail at the end of minutes of timing; ``spell``
        names the options as the caller writes them (``--loop-runs`` or ``loop_runs``)."""
        for option, value, least in (
            ("workers", self.workers, 2),
            ("threads_per_worker", self.threads_per_worker, 1),
            ("repeats", repeats, 1),
            ("loop_steps", loop_steps, 1),
            ("loop_runs", self.loop_runs, 1),
        ):
            if value < least:
                raise TetherError(f"{spell(option)} must be at least {least}, got {value}")
        if not self.timeout > 0:
            raise TetherError(
                f"{spell('timeout')} must be a positive number of seconds, got {self.timeout}"
            )


def busy_node_workers(options: CalibrationOptions) -> int:
    """How many workers the busy-node runs start: one per core (of ``threads_per_worker``
    threads), at most ``options.most_workers``."""
    cores = len(usable_cores()) // max(1, options.threads_per_worker)
    return max(1, min(ONE_NODE, cores, options.most_workers))


def calibrate_machine(
    name: str,
    what: str,
    time_layers: Callable[[], tuple[Workload, float]],
    loops: LoopTimer,
    options: CalibrationOptions,
    say: Callable[[str], None],
) -> Calibration:
    """Measure the running machine: ``options.loop_runs`` rounds of a compute sample
    (:class:`~tether.bench.compute_samples.ComputeSamples`: ``time_layers`` and ``loops``), a
    measurement of the links and of the exchange in training
    (:class:`~tether.bench.exchange_load.ExchangeSamples`), the server's wire after the first
    round, so that the samples span the whole calibration; the medians are kept
    (:func:`median_links`). ``loops`` runs the training loop: ``tether train``'s
    (:class:`~tether.bench.compute_samples.TrainerLoops`) or ``tether.fit``'s; ``say`` reports
    each step."""
    threads = max(1, options.threads_per_worker)
    samples = ComputeSamples(time_layers, loops, busy_node_workers(options))
    exchanges = ExchangeSamples(loops, options.workers)

    def take_sample() -> None:
        pair = f" and on {samples.node_workers}" if samples.node_workers > 1 else ""
        say(
            f"timing {what} and the training loop on one worker{pair} "
            f"({len(samples.single) + 1} of {options.loop_runs})"
        )
        samples.take()

    link_samples: list[LinkFit] = []
    wire: WireFit | None = None
    for _ in range(options.loop_runs):
        take_sample()
        say(
            f"timing native all-reduce on {options.workers} local ranks "
            f"({len(link_samples) + 1} of {options.loop_runs})"
        )
        link_samples.append(measure_links(options.workers, threads, options.timeout))
        say(
            f"timing sync-sgd's exchange in training on {options.workers} workers "
            f"({len(exchanges.fused) + 1} of {options.loop_runs})"
        )
        exchanges.take()
        if wire is None:
            say("timing the parameter server's wire on 2 local ranks")
            wire = measure_server_wire(options.timeout)
    assert wire is not None, "loop_runs is at least 1 (checked by the command)"
    links = median_links(link_samples)
    workload, step_s = samples.workload()
    busy = samples.busy_node_slowdown(links.when)
    idle = hardware_profile(name, links, workload, step_s, threads, wire, busy)
    load = fit_exchange_load(idle, workload, exchanges, links.when)
    profile = dataclasses.replace(idle, exchange_load=load)
    return Calibration(profile, workload, step_s, links, link_samples, wire, samples, exchanges)


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
