"""``tether.calibrate``: measure this machine and the user's own model for the performance model,
from Python, as ``tether calibrate`` does from the command line::

    cal = tether.calibrate(model=build_net, train_data=train_ds, loss=F.cross_entropy,
                           batch_size=64, out="runs/cal/profile.json")
    tether.predict(cal.workload, "sync-easgd", workers=4, profile=cal.profile)

The same measurement as the command (:func:`tether.bench.calibrate.calibrate_machine`): the
model's training step layer by layer on its first batch, the links (native all-reduce on
``workers`` local ranks), the parameter server's wire, and the training loop's own cost, a busy
node's slowdown and the exchange under load from short runs; here those runs are ``tether.fit``
runs of the user's model, data, loss and optimizer (:class:`FitLoops`), so what a step of the
user's loop adds (the DataLoader's collation, the loss) is in the profile.
"""

from __future__ import annotations

import copy
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tether.bench.compute_samples import LoopTimes, loop_times_from_metrics
from tether.bench.exchange_load import ExchangeSamples
from tether.catalog import OversubscribedWarning, loss_named
from tether.errors import TetherError
from tether.perf.profile import HardwareProfile
from tether.perf.workload import Workload
from tether.perf_inputs import check_out_file
from tether.spelling import as_keyword

# the first steps of a run warm up (allocations, the first collectives): timed from this step on
WARM_STEPS = 10
# what each timed run sets (FitLoops), or what would make it other than a short fresh run: not
# the caller's to give
RUN_KEYS = frozenset(
    {
        "method", "steps", "epochs", "eval_every", "tau", "bucket_mb", "overlap", "overwrite",
        "resume", "target", "stop_at_target",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Calibrated:
    """What :func:`calibrate` measured: the hardware ``profile``, the model's ``workload`` (its
    timed layers, which predictions on this profile use), and the file written (``path``: for
    ``tether predict --profile``), if asked for one."""

    profile: HardwareProfile
    workload: Workload
    path: Path | None


@dataclass
class FitLoops:
    """The training loop of ``tether.fit`` on the user's model and data, timed between steps
    ``short`` and ``long`` of one run (a :class:`~tether.bench.compute_samples.LoopTimer`):
    start-up, the first steps' warm-up and the final evaluation are left out."""

    fit_arguments: dict[str, Any]
    short: int
    long: int

    def one_worker(self) -> LoopTimes:
        return self._run("sync-sgd", 1, {})

    def quiet(self, workers: int) -> LoopTimes:
        return self._run("local-sgd", workers, {"tau": self.long + 1})

    def exchanging(self, workers: int, bucket_mb: float) -> LoopTimes:
        return self._run("sync-sgd", workers, {"bucket_mb": bucket_mb, "overlap": False})

    def serving(self, workers: int) -> LoopTimes:
        return self._run("async-sgd", workers, {})

    def check(self, workers: int, node_workers: int) -> None:
        """A one-line error now for what any of the calibration's runs would refuse after
        minutes of others: each kind of run checked as this timer would start it (the exchange
        runs through :class:`~tether.bench.exchange_load.ExchangeSamples` itself)."""
        checks = _CheckedFitLoops(self.fit_arguments, self.short, self.long)
        checks.one_worker()
        checks.quiet(node_workers)
        ExchangeSamples(checks, workers).take()

    def _fixed(self, method: str, workers: int, settings: dict[str, Any]) -> dict[str, Any]:
        # the final evaluation only: it is not timed
        return dict(method=method, workers=workers, steps=self.long, eval_every=10**9, **settings)

    def _run(self, method: str, workers: int, settings: dict[str, Any]) -> LoopTimes:
        from tether.api.fit import fit

        with (
            tempfile.TemporaryDirectory(prefix="tether-calibrate-") as scratch,
            warnings.catch_warnings(),
        ):
            # a server and its workers on every core is what the calibration means to time
            warnings.simplefilter("ignore", OversubscribedWarning)
            out = Path(scratch) / "fit"
            fit(**self.fit_arguments, **self._fixed(method, workers, settings), out=out)
            metrics = (out / "metrics.jsonl").read_text()
        return loop_times_from_metrics(metrics, self.short, self.long)


class _CheckedFitLoops(FitLoops):
    """:class:`FitLoops` whose runs are checked (``tether.fit``'s refusals before a worker
    starts), not run."""

    def _run(self, method: str, workers: int, settings: dict[str, Any]) -> LoopTimes:
        from tether.api.fit import check_fit

        launch_only = {"collate_fn", "loader_options", "overwrite"}
        arguments = {k: v for k, v in self.fit_arguments.items() if k not in launch_only}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OversubscribedWarning)
            check_fit(**arguments, **self._fixed(method, workers, settings))
        return LoopTimes(0.0, 0.0)


def first_batch(
    train_data: Dataset, batch_size: int, collate_fn: Callable[[list[Any]], Any] | None
) -> tuple[Any, Any]:
    """The first batch as (inputs, targets), which the layers are timed on; one line for an
    empty data set or a batch of another form (``tether calibrate | predict`` take theirs here
    too, so that the command and the function say the same)."""
    from tether.training.objective import split_batch

    loader = DataLoader(train_data, batch_size=batch_size, collate_fn=collate_fn)
    try:
        batch = next(iter(loader))
    except StopIteration:
        raise TetherError("train_data is empty: there is no batch to time") from None
    try:
        return split_batch(batch)
    except TetherError:
        raise TetherError(
            f"calibrate times the layers on an (inputs, targets) batch, and a batch of "
            f"train_data is a {type(batch).__name__}: give a data set of (inputs, targets) "
            "pairs, or a collate_fn that makes them"
        ) from None


def model_name(model: Any, net: nn.Module) -> str:
    """The workload's model name in the profile: a factory's import path (``mypkg.nets:build``)
    where it has one, as ``tether predict --model`` takes it, so that the command finds the
    file's timed layers by name as it does for a file of ``tether calibrate``; else the module's
    class name (the command then matches the layers themselves)."""
    module, qualname = getattr(model, "__module__", None), getattr(model, "__qualname__", "")
    importable = module and module != "__main__" and qualname.isidentifier()
    if not isinstance(model, nn.Module) and importable:
        return f"{module}:{qualname}"
    return type(net).__name__


def calibrate(
    model: nn.Module | Callable[[], nn.Module],
    train_data: Dataset,
    loss: Callable[..., torch.Tensor] | str,
    optimizer: Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer] | None = None,
    *,
    batch_size: int = 64,
    workers: int = 2,
    loop_runs: int = 3,
    loop_steps: int = 60,
    repeats: int = 20,
    threads_per_worker: int = 1,
    name: str | None = None,
    out: str | Path | None = None,
    timeout: float = 120.0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    progress: bool = True,
    **options: Any,
) -> Calibrated:
    """Measure this machine and ``model`` into a hardware profile and a workload.

    ``model``, ``train_data``, ``loss``, ``optimizer`` and ``collate_fn`` are as in
    :func:`tether.fit` (the loss in its ``(outputs, targets)`` form: the layers are timed on
    the first batch's inputs); ``options`` are further ``tether.fit`` options for the timed runs
    (``precision``, ``accumulate``, ...). ``workers`` local ranks time the links and the
    exchange in training; ``loop_runs`` rounds of samples spread over the calibration, each
    ``loop_steps`` timed steps of a short run; ``repeats`` timed steps of the layers. ``out``:
    also write the profile file that ``tether predict --profile`` reads. ``progress``: say each
    step on stderr. Several minutes on a small machine (2 cores, LeNet-5: about 3)."""
    from tether.bench.calibrate import (
        ONE_NODE,
        CalibrationOptions,
        busy_node_workers,
        calibrate_machine,
        time_model,
        write_calibration,
    )
    from tether.training.objective import takes_model_and_batch

    if batch_size < 1:
        raise TetherError(f"batch_size must be at least 1, got {batch_size}")
    # a small data set holds only so many global batches: the busy-node runs start no more
    most = len(train_data) // batch_size if isinstance(train_data, Sized) else ONE_NODE
    options_checked = CalibrationOptions(
        workers, threads_per_worker, loop_runs, timeout, max(1, min(ONE_NODE, most))
    )
    options_checked.check(loop_steps, repeats, spell=as_keyword)
    if isinstance(model, str) or isinstance(train_data, str):
        raise TetherError(
            "calibrate takes your model and data set as objects; for a built-in one by name use "
            "`tether calibrate --model NAME --dataset NAME`"
        )
    if not (isinstance(model, nn.Module) or callable(model)):
        raise TetherError(
            f"model must be a torch.nn.Module or a function returning one, not "
            f"{type(model).__name__}"
        )
    timed_loss = loss_named(loss, options.get("label_smoothing", 0.0))  # "mse", as fit takes it
    if takes_model_and_batch(timed_loss):
        raise TetherError(
            "calibrate times the layers on an (inputs, targets) batch: give a loss of the form "
            "loss(outputs, targets)"
        )
    if options.get("model_parallel", 1) != 1 or options.get("parallel_plan"):  # as the command
        raise TetherError(
            "calibrate times data-parallel runs, and the performance model does not cover model "
            "parallelism: leave model_parallel and parallel_plan out"
        )
    fixed = sorted(set(options) & RUN_KEYS)
    if fixed:
        raise TetherError(
            f"calibrate sets {', '.join(fixed)} of its timed runs itself: leave "
            f"{'it' if len(fixed) == 1 else 'them'} out"
        )
    path = Path(out) if out is not None else None
    if path is not None:  # the file is written at the end of minutes of timing
        check_out_file(path, spell=as_keyword)
    profile_name = name or "this-machine-calibrated"
    inputs, targets = first_batch(train_data, batch_size, collate_fn)
    fit_arguments: dict[str, Any] = dict(
        model=model,
        train_data=train_data,
        loss=loss,
        optimizer=optimizer,
        batch_size=batch_size,
        collate_fn=collate_fn,
        threads_per_worker=threads_per_worker,
        overwrite=True,
        **options,
    )
    loops = FitLoops(fit_arguments, WARM_STEPS, WARM_STEPS + loop_steps)
    loops.check(workers, busy_node_workers(options_checked))  # before minutes of timing

    def time_layers() -> tuple[Workload, float]:
        # a copy: the timed steps train it, and the caller's module must stay as it was
        net = copy.deepcopy(model) if isinstance(model, nn.Module) else model()
        if not isinstance(net, nn.Module):
            raise TetherError(f"model() must return a torch.nn.Module, not {type(net).__name__}")
        params = list(net.parameters())
        opt = optimizer(params) if optimizer else torch.optim.SGD(params, lr=0.01, momentum=0.9)
        what = model_name(model, net)
        return time_model(
            net, inputs, targets, timed_loss, opt, what, profile_name, threads_per_worker, repeats
        )

    def say(line: str) -> None:
        if progress:
            print(f"tether: {line}", file=sys.stderr, flush=True)

    calibration = calibrate_machine(
        profile_name,
        f"the model at batch {batch_size}",
        time_layers,
        loops,
        options_checked,
        say,
    )
    if path is not None:
        write_calibration(path, calibration.profile, calibration.workload, calibration.extra())
        say(f"wrote {path} (tether predict --profile {path})")
    return Calibrated(calibration.profile, calibration.workload, path)
