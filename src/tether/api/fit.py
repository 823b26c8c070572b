"""``tether.fit``: train the caller's own model on the caller's own data with any method, in one
call, on local worker processes.

The arguments are Python objects (a module or a model factory, map-style datasets, a loss, an
optimizer factory, ...); they reach the worker processes by pickle (see
:mod:`tether.training.task_file`), so they must be defined at the top level of a module or of the
script, and the script must guard its own work with ``if __name__ == "__main__":``. Registered
names and import paths (``model="lenet5"``, ``train_data="fashion-mnist"``, ``loss="mse"``,
``optimizer="adamw"``) work too. Every option of ``tether train`` is a keyword (``tau``,
``allreduce``, ``compress``, ``seed``, ...).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from tether.catalog import (
    check_global_batch,
    check_launch,
    check_names,
    check_stop_at_target,
    load_data,
    loss_function,
    method_defaults,
    model_factory,
    named_metrics,
    optimizer_factory,
    schedule_factory,
)
from tether.config import TrainConfig
from tether.config_sources import resolve_config
from tether.data.user_data import infer_shape_and_classes
from tether.errors import TetherError
from tether.ignored_settings import own_component_keys, warn_ignored, warn_long_warmup
from tether.methods import METHODS
from tether.resume_settings import check_kept, saved_config
from tether.run_names import run_stamp
from tether.runner import launch_training
from tether.targets import target_text
from tether.training.model_parallel import check_plan_on_model, plan_option
from tether.training.probe import probe_task, unseeded_model
from tether.training.run_dir import check_run_dir
from tether.training.task import Task, describe
from tether.training.task_file import write_task


@dataclass(frozen=True)
class FitResult:
    """What ``tether.fit`` returns: the run's summary.json, the evaluated model (the center
    variable for the EASGD methods) loaded into a fresh copy of the caller's model and in
    ``eval()`` mode, and the run directory."""

    summary: dict[str, Any]
    model: nn.Module
    run_dir: Path

    @property
    def history(self) -> list[dict[str, Any]]:
        """The evaluations: ``{time_s, step, epoch, test_loss, test_<metric>, ...}``."""
        return list(self.summary.get("history", []))


def fit(
    model: nn.Module | Callable[[], nn.Module] | str,
    train_data: Dataset | str,
    eval_data: Dataset | None = None,
    loss: Callable[..., torch.Tensor] | str | None = None,
    optimizer: Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer] | str | None = None,
    scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | str | None = None,
    metrics: Mapping[str, Callable[..., float]] | Iterable[str] | None = None,
    method: str | None = None,
    workers: int | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    out: str | Path | None = None,
    target: tuple[str, float] | tuple[str, str, float] | str | None = None,
    log: str | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    loader_options: Mapping[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    **options: Any,
) -> FitResult:
    """Train ``model`` on ``train_data`` with ``method`` (default sync-easgd) on ``workers``
    local processes (default 2) for ``epochs`` (default 1; with ``resume=True`` the three
    default to the run's).

    - ``model``: an ``nn.Module``, a zero-argument callable returning one, or a registered name /
      import path.
    - ``train_data``, ``eval_data``: map-style ``torch.utils.data.Dataset`` s; batches may be
      tensors, tuples, lists or dicts (``collate_fn`` and ``loader_options`` such as
      ``num_workers`` go to the DataLoader). Or a registered data set name for ``train_data``
      (its test split is the evaluation set).
    - ``loss``: ``loss(outputs, targets)`` for ``(inputs, targets)`` batches, or
      ``loss(model, batch)`` (parameters named so) for anything else; default cross-entropy.
    - ``optimizer``: ``params -> Optimizer`` (default: the method's own local step with ``lr``,
      ``momentum``, ``weight_decay``); ``scheduler``: ``optimizer -> LRScheduler``, stepped once
      per optimizer step (for asynchronous methods, on the run's global step).
    - ``metrics``: ``{name: metric(outputs, targets) -> float}``, averaged over ``eval_data``
      (default: the mean loss, plus accuracy for classifiers).
    - ``target``: ``("accuracy", 0.88)``, ``("loss", "<=", 0.3)`` or ``"accuracy>=0.88"``: its
      time is recorded; with ``stop_at_target=True`` the run stops there.
    - ``log="tensorboard"`` also writes TensorBoard event files; ``resume=True`` continues the
      run in ``out`` from its last checkpoint (``checkpoint_every=N``) with the run's settings
      for what the call leaves out; another value for one its checkpoint was made under (the
      optimizer, the rate and schedule, ``accumulate``, ``precision``, ``tau``, ... :
      :mod:`tether.resume_settings`) is refused; an ``out`` that already
      holds something is refused unless ``resume=True`` or ``overwrite=True`` (which replaces
      Tether's files there, and nothing else).
    - ``model_parallel=K`` with ``parallel_plan={"fc1": "column", "fc2": "row"}``: model
      groups of K ranks split the named layers (docs/parallel.md); sync-sgd, sync-easgd and
      local-sgd run over the data-parallel axis.
    - ``**options``: any other config key (``tau``, ``alpha``, ``allreduce``, ``compress``,
      ``seed``, ``lr``, ``accumulate``, ...).

    Raises :class:`~tether.errors.TetherError` (one line, before any worker starts) for bad
    input, and :class:`~tether.errors.WorkerFailure` when a worker fails.
    """
    config, given, supplied = _config(
        model, train_data, loss, optimizer, scheduler, metrics, method, workers, epochs,
        batch_size, out, target, log, resume, options,
    )  # fmt: skip
    warn_ignored(config, given, stacklevel=2, supplied=supplied)
    task = _task(config, model, train_data, eval_data, loss, optimizer, scheduler, metrics)
    # loader_workers (a config key, as --loader-workers) is the loader's num_workers unless the
    # loader options name one
    loading = {"num_workers": config.loader_workers} if config.loader_workers else {}
    loading.update(loader_options or {})
    task = dataclasses.replace(task, collate_fn=collate_fn, loader_options=loading)
    model = unseeded_model(task)  # built once, for every check below
    METHODS.get(config.method).check_model(model)  # e.g. one dtype (as each worker would find)
    check_plan_on_model(config, model)  # before the probe's forward (it fills lazy layers)
    probe_task(task, model=model, target=config.target_spec, config=config)
    check_launch(config)
    if isinstance(task.train_data, Sized):
        check_global_batch(config, len(task.train_data))
        warn_long_warmup(config, len(task.train_data), supplied)
    run_dir = Path(str(config.out))
    # before the task is written: nothing to undo (a resumed checkpoint against the model)
    check_run_dir(config, overwrite, model if config.resume else None, task)
    scratch = Path(tempfile.mkdtemp(prefix="tether-fit-"))  # private (0700): holds the task
    try:
        task_file = scratch / "task.pickle"
        write_task(task, task_file)
        launch_training(config, task_file, overwrite=overwrite)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    return FitResult(summary, _load_model(task, run_dir, config.seed), run_dir)


def check_fit(
    model: Any,
    train_data: Any,
    loss: Any = None,
    optimizer: Any = None,
    method: str = "sync-easgd",
    workers: int = 2,
    batch_size: int | None = None,
    **options: Any,
) -> None:
    """What :func:`fit` with these arguments would refuse before starting a worker (the config,
    the launch, the global batch against the data set), raised without running anything: for
    a caller about to start many runs (``tether.calibrate``) to fail in one line at once."""
    config, _, _ = _config(
        model, train_data, loss, optimizer, None, None, method, workers, 1, batch_size, None,
        None, None, False, options,
    )  # fmt: skip
    check_launch(config)
    if isinstance(train_data, Sized):
        check_global_batch(config, len(train_data))


FIT_DEFAULTS = {"method": "sync-easgd", "workers": 2, "epochs": 1}


def _config(
    model: Any,
    train_data: Any,
    loss: Any,
    optimizer: Any,
    scheduler: Any,
    metrics: Any,
    method: str | None,
    workers: int | None,
    epochs: int | None,
    batch_size: int | None,
    out: Any,
    target: Any,
    log: str | None,
    resume: bool,
    options: Mapping[str, Any],
) -> tuple[TrainConfig, set[str], set[str]]:
    """The run's config, the keys the caller set (for the ignored-setting warnings) and the
    components it gave as objects rather than names."""
    # Left out: the defaults, or on a resume the run's own (its saved config is the base).
    fresh = {} if resume else FIT_DEFAULTS
    named = {"method": method, "workers": workers, "epochs": epochs}
    values: dict[str, Any] = {
        **fresh,
        **{key: value for key, value in named.items() if value is not None},
        **options,
    }
    if batch_size is not None:  # None: the method's default (64, or held: docs/api.md)
        values["batch_size"] = batch_size
    values["model"] = model if isinstance(model, str) else describe(model)
    values["dataset"] = train_data if isinstance(train_data, str) else describe(train_data)
    for key, value in (("loss", loss), ("optimizer", optimizer), ("lr_schedule", scheduler)):
        if isinstance(value, str):
            values[key] = value
    if callable(optimizer) or callable(scheduler):
        # The user's own optimizer (or schedule) sets the rate: no default scaling or warm-up.
        values.setdefault("lr_base_batch", 0)
    if metrics is not None and not isinstance(metrics, Mapping):
        values["metrics"] = tuple(metrics)
    if values.get("parallel_plan", ()) is None:  # None: no plan, as leaving it out
        del values["parallel_plan"]
    if "parallel_plan" in values:  # {"fc1": "column"}: the config's "fc1=column" entries
        values["parallel_plan"] = plan_option(values["parallel_plan"])
    if target is not None:
        values["target"] = _target(target)
    if log is not None:
        if log != "tensorboard":
            raise TetherError(f"log must be 'tensorboard' or None, got {log!r}")
        values["tensorboard"] = True
    stamp = run_stamp()
    values["out"] = str(out) if out is not None else f"runs/{values['method']}-{stamp}"
    saved = None
    if resume:
        if out is None:
            raise TetherError("resume=True needs out=DIR, the run to continue")
        values["resume"] = True
        # the run's config is the base, as under `tether train --resume`: what the call leaves
        # out is the run's (its batch, which a method held, is not worked out again for another
        # worker count, with its rate, mid-run), and what the checkpoint was made under stays
        saved = saved_config(Path(out), values)
    values.setdefault("progress", False)  # a library call: no progress bar unless asked
    config = resolve_config(None, values, base=saved, method_defaults=method_defaults)
    own = {
        key
        for key, value in (("optimizer", optimizer), ("lr_schedule", scheduler))
        if callable(value)
    }
    if saved is not None:  # a rate the user's own optimizer sets is not the run's to keep
        check_kept(saved, config, Path(out), own_component_keys(config, own))
    supplied = {
        key
        for key, value in (
            ("model", model),
            ("dataset", train_data),
            ("loss", loss),
            ("optimizer", optimizer),
            ("lr_schedule", scheduler),
            ("metrics", metrics),
        )
        # a list of metrics is of names; a list as train_data is a data set of its own
        if value is not None
        and not isinstance(value, str)
        and not (key == "metrics" and isinstance(value, list | tuple))
    }
    check_names(config, supplied=supplied)
    check_stop_at_target(config)
    given = set(options) - {"progress"}
    return config, given, supplied


def _target(target: Any) -> str:
    if isinstance(target, str):
        return target
    value = target[-1] if isinstance(target, tuple | list) and target else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if len(target) == 2:
            return target_text(str(target[0]), float(value))
        if len(target) == 3 and target[1] in (">=", "<=", ">", "<"):  # as the CLI's text
            return target_text(str(target[0]), float(value), above=target[1].startswith(">"))
    raise TetherError(
        f"target must be (metric, value), (metric, '>=' or '<=', value) or 'metric>=value', "
        f"got {target!r}"
    )


def _task(
    config: TrainConfig,
    model: Any,
    train_data: Any,
    eval_data: Any,
    loss: Any,
    optimizer: Any,
    scheduler: Any,
    metrics: Any,
) -> Task:
    """The caller's objects, with names and import paths resolved in this process."""
    shape: tuple[int, ...] = ()
    classes: int | None = None
    if isinstance(train_data, str):
        if eval_data is not None:
            raise TetherError(
                "a named data set brings its own evaluation split: leave eval_data out"
            )
        train_data, eval_data, shape, classes = load_data(config)
    elif isinstance(model, str):
        shape, classes = infer_shape_and_classes(train_data)
    built_model = model_factory(config, shape, classes) if isinstance(model, str) else model
    if not (isinstance(built_model, nn.Module) or callable(built_model)):
        raise TetherError(
            f"model must be an nn.Module or a callable returning one, got a "
            f"{type(built_model).__name__}"
        )
    return Task(
        model=built_model,
        train_data=train_data,
        eval_data=eval_data,
        loss=loss_function(config) if loss is None or isinstance(loss, str) else loss,
        optimizer=(
            optimizer_factory(config)
            if optimizer is None or isinstance(optimizer, str)
            else optimizer
        ),
        scheduler=(
            schedule_factory(config)
            if scheduler is None or isinstance(scheduler, str)
            else scheduler
        ),
        metrics=_metrics(metrics),
        model_name=config.model,
        data_name=config.dataset,
    )


def _metrics(metrics: Any) -> dict[str, Callable[..., float]] | None:
    if metrics is None:
        return None
    if isinstance(metrics, Mapping):
        for name, fn in metrics.items():
            if not callable(fn):
                raise TetherError(f"metric {name!r} is a {type(fn).__name__}, not a callable")
        return dict(metrics)
    return named_metrics(metrics)


def _load_model(task: Task, run_dir: Path, seed: int) -> nn.Module:
    """A fresh copy of the model with the run's evaluated weights (``model.pt``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = task.build_model()
    state = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()  # as it was evaluated (dropout off, batch norm's running statistics)
