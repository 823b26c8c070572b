"""Names and import paths -> components: what turns a config into a :class:`Task`.

The command line and config files name components (``--model lenet5``, ``--loss mse``,
``--optimizer adamw``, or ``mypkg.nets:build`` for the user's own); this module is the one place
that knows every registry and resolves those names. It also applies a method's tuned defaults,
checks every name before any process starts (:mod:`tether.ignored_settings` warns about the
settings the chosen method ignores).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from tether import config_sources
from tether.comm.collectives import COLLECTIVES, collectives_for
from tether.config import TrainConfig
from tether.data import DATASETS, check_dataset, fill_dataset_cache, load_dataset
from tether.data.user_data import infer_shape_and_classes, load_user_data
from tether.errors import SettingError, TetherError
from tether.imports import is_import_path, load_object
from tether.launch.partition import plan_partition, usable_cores
from tether.methods import METHODS
from tether.metrics import METRICS
from tether.models import MODELS, build_model
from tether.observe.tensorboard import require_tensorboard
from tether.optim import OPTIMIZERS, SCHEDULES, NamedOptimizer, NamedSchedule, ScheduleSettings
from tether.optim.builders import OptimizerSettings
from tether.spelling import Spell, as_keyword, both_ways
from tether.training.objective import LOSSES
from tether.training.task import Task
from tether.words import counted


class OversubscribedWarning(UserWarning):
    """More local processes than cores."""


class OneNodeWarning(UserWarning):
    """A two-level method whose workers all sit on one node (it then has one level)."""


def method_defaults(method: str) -> dict[str, Any]:
    """The tuned defaults a method declares (empty for an unknown name: the check reports it)."""
    return dict(METHODS.get(method).defaults) if method in METHODS else {}


def resolve_config(
    file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    base: TrainConfig | None = None,
) -> TrainConfig:
    """Defaults (or ``base``) <- the method's tuned defaults <- config file <- overrides, validated,
    every name and import path checked."""
    from tether.training.model_parallel import check_method_composes

    given = {**dataclasses.asdict(base or TrainConfig()), **(overrides or {})}
    check_method_composes(given["method"], given["model_parallel"])  # before the worker count
    config = config_sources.resolve_config(file, overrides, base, method_defaults)
    check_names(config)
    return config


def check_names(config: TrainConfig, supplied: Iterable[str] = ()) -> None:
    """Every name the config uses exists, every import path resolves; a TetherError otherwise.
    ``supplied``: the component keys given as objects (``tether.fit``), whose config value only
    describes them."""
    METHODS.get(config.method)
    valid = collectives_for("all_reduce")  # "auto" among them
    if config.allreduce not in valid:
        # a collective of `tether list` that has no all-reduce (chain) is no unknown name
        what = "has no all-reduce" if config.allreduce in COLLECTIVES else "is no collective"
        raise SettingError(
            "allreduce",
            f"allreduce {config.allreduce!r} {what}; the all-reduce algorithms: {', '.join(valid)}",
        )
    skip = set(supplied)
    for key, registry in (
        ("model", MODELS),
        ("dataset", DATASETS),
        ("loss", LOSSES),
        ("optimizer", OPTIMIZERS),
        ("lr_schedule", SCHEDULES),
    ):
        value = getattr(config, key)
        if key not in skip and not (key == "optimizer" and value == "auto"):
            _check(value, registry, key)
    if "metrics" not in skip:
        for metric in config.metrics:
            _check(metric, METRICS, "metric")
        _check_target_metric(config)
    if config.tensorboard:
        require_tensorboard()
    own_step = config.optimizer == "auto" and "optimizer" not in skip
    lookahead = METHODS.get(config.method).local_step_name == "lookahead-nesterov"
    if config.accumulate > 1 and own_step and lookahead:
        raise TetherError(
            f"{config.method}'s look-ahead Nesterov step takes its gradient inside the step, "
            f"so it cannot accumulate gradients: use {both_ways(accumulate=1)}, or "
            f"{both_ways(optimizer='sgd')}"
        )
    if config.precision == "fp16" and own_step and lookahead:
        raise TetherError(
            f"{config.method}'s look-ahead Nesterov step takes its gradient inside the step, "
            f"where fp16's loss scale cannot be checked: use {both_ways(precision='bf16')}, or "
            f"{both_ways(optimizer='sgd')}"
        )


def check_stop_at_target(config: TrainConfig) -> None:
    """A run told to stop at its target has one (`tether compare` gives its runs a default
    one, so this is for `tether train` and `tether.fit`)."""
    if config.stop_at_target and config.target_spec is None:
        raise TetherError(
            "stop_at_target needs a target to stop at: give --target-accuracy 0.88 or --target "
            "'loss<=0.3' (tether.fit: target=)"
        )


def _check_target_metric(config: TrainConfig) -> None:
    """The target names a metric the run evaluates (the loss, accuracy, or a --metric)."""
    target = config.target_spec
    if target is None:
        return
    own = [m.rpartition(":")[2].rpartition(".")[2] for m in config.metrics if is_import_path(m)]
    if target.metric == "accuracy" and "accuracy" not in own and not 0 < target.value <= 1:
        # the built-in accuracy is a fraction: a target above 1 would never be reached
        raise TetherError(
            f"accuracy is a fraction in (0, 1], got {target.value:g} in target {target} (write "
            "accuracy>=0.9 for 90%)"
        )
    if own:
        return  # an imported metric's name is known once it is loaded
    known = {"loss", "accuracy", *config.metrics}
    if target.metric not in known:
        raise TetherError(
            f"the target's metric {target.metric!r} is not evaluated; evaluated: "
            f"{', '.join(sorted(known))} (add metrics with --metric NAME; tether.fit: metrics=)"
        )


def _check(name: str, registry: Any, what: str) -> None:
    if is_import_path(name):
        load_object(name, what)
    else:
        registry.get(name)


def uses_import_paths(config: TrainConfig) -> bool:
    """Whether the run takes any of the user's own components (which get a dry run first)."""
    names = [config.model, config.dataset, config.loss, config.optimizer, config.lr_schedule]
    names += config.metrics
    return any(is_import_path(name) for name in names)


def check_data(config: TrainConfig) -> int | None:
    """A built-in data set's files are present and sound, and hold at least one global batch
    (one line otherwise), before launch. Returns its training samples (None for the user's
    own data set, which its probe checks)."""
    if is_import_path(config.dataset):
        return None
    data_dir = Path(config.data_dir) if config.data_dir else None
    samples = check_dataset(config.dataset, data_dir)
    check_global_batch(config, samples)
    fill_dataset_cache(config.dataset, data_dir)
    return samples


def check_global_batch(config: TrainConfig, samples: int) -> None:
    """A step takes one global batch: a data set smaller than that has no step to take."""
    global_batch = config.batch_size * config.data_workers * config.accumulate
    who = (
        counted(config.data_workers, "model group")
        if config.model_parallel > 1
        else counted(config.workers, "worker")
    )
    if global_batch > samples:
        accumulated = config.accumulate > 1
        raise SettingError(
            "batch_size",
            f"the global batch ({who} x batch {config.batch_size}"
            + (f" x accumulate {config.accumulate}" if accumulated else "")
            + f" = {global_batch}) is larger than the training set ({samples} samples): lower "
            "{options}",
            ("batch_size", "workers", *(("accumulate",) if accumulated else ())),
        )


def method_backend(method: str, requested: str) -> str:
    """The backend to ask for: ``auto`` is gloo for a method whose weights are shared in host
    memory (Hogwild), which a GPU's NCCL backend would only make refuse to start; otherwise
    as requested (``auto`` then looks at the node's GPUs: tether.launch.worker.resolve_backend)."""
    host_memory = getattr(METHODS.get(method), "host_memory", False)
    return "gloo" if requested == "auto" and host_memory else requested


def gpu_free_ranks(method: str) -> int:
    """The ranks of ``method`` that need no GPU of their own (tether.launch.worker.place)."""
    chosen = METHODS.get(method)
    return chosen.server_processes if getattr(chosen, "gpu_free_server", False) else 0


def check_launch(config: TrainConfig, spell: Spell = as_keyword) -> None:
    """What a local run needs beyond a valid config: the fault rank exists, the backend's
    devices do (a one-line TetherError otherwise). ``spell``: how a warning names a setting."""
    from tether.launch.worker import resolve_backend
    from tether.training.model_parallel import check_model_parallel

    check_model_parallel(config)
    processes = config.workers + METHODS.get(config.method).server_processes
    if config.fault_rank >= processes:
        raise TetherError(
            f"fault_rank {config.fault_rank} is not a rank of this run (ranks 0..{processes - 1})"
        )
    backend = method_backend(config.method, config.backend)
    resolve_backend(backend, processes, gpu_free_ranks(config.method))
    # every local process is one part of this node (refuses more threads than cores)
    cores = usable_cores()
    plan_partition(processes, config.threads_per_worker, config.pin_workers, cores)
    if config.method == "two-level-easgd" and config.ranks_per_node in (0, config.workers):
        warnings.warn(
            f"two-level-easgd with all {config.workers} workers on one node runs as sync-sgd "
            f"(no elastic rounds): set {spell('ranks_per_node')} to G to split them into "
            "emulated nodes of G",
            OneNodeWarning,
            stacklevel=2,
        )
    warn_oversubscribed(processes, len(cores), stacklevel=3)


def warn_oversubscribed(processes: int, cores: int, stacklevel: int = 2) -> None:
    """More of a node's processes than its cores: said, not refused (a test of many workers on
    a small machine is legitimate)."""
    if processes > cores:
        warnings.warn(
            f"{processes} processes on {cores} cores: they take turns on the cores (one thread "
            "each), so expect a slow run",
            OversubscribedWarning,
            stacklevel=stacklevel,
        )


# -- the task from a config (in each worker) ----------------------------------------------------
def optimizer_factory(config: TrainConfig) -> Callable[..., torch.optim.Optimizer] | None:
    """None for ``auto`` (the method's own local step)."""
    if config.optimizer == "auto":
        return None
    if is_import_path(config.optimizer):
        return load_object(config.optimizer, "optimizer")
    return NamedOptimizer(config.optimizer, OptimizerSettings.of(config))


def schedule_factory(config: TrainConfig) -> Callable[..., Any] | None:
    """None for a constant rate without warm-up."""
    if is_import_path(config.lr_schedule):
        return load_object(config.lr_schedule, "lr_schedule")
    if config.lr_schedule == "constant" and not (config.warmup_steps or config.warmup_epochs):
        return None
    settings = ScheduleSettings(
        warmup_steps=config.warmup_steps,
        decay_every=config.lr_decay_every,
        decay=config.lr_decay,
        power=config.lr_decay_power,
        warmup_epochs=config.warmup_epochs,
    )
    return NamedSchedule(config.lr_schedule, settings)


def loss_function(config: TrainConfig) -> Callable[..., torch.Tensor]:
    if not is_import_path(config.loss):
        return LOSSES.get(config.loss)(config.label_smoothing)
    loss = load_object(config.loss, "loss")
    if isinstance(loss, type) and issubclass(loss, nn.Module):
        loss = loss()  # a loss class, e.g. mypkg.losses:FocalLoss
    if not callable(loss):
        raise TetherError(f"loss {config.loss!r} is a {type(loss).__name__}, not a callable")
    return loss


def loss_named(loss: Callable[..., torch.Tensor] | str, label_smoothing: float = 0.0) -> Any:
    """A loss as ``tether.fit`` takes it: a callable, or a name (``"mse"``) or import path,
    which is resolved here (for the functions that call the loss themselves)."""
    if not isinstance(loss, str):
        return loss
    named = dataclasses.replace(TrainConfig(), loss=loss, label_smoothing=label_smoothing)
    return loss_function(named.validate())


def metric_functions(config: TrainConfig) -> dict[str, Callable[..., float]] | None:
    """None when no metric is named (the defaults: loss, plus accuracy for classifiers)."""
    return named_metrics(config.metrics) if config.metrics else None


def named_metrics(names: Iterable[str]) -> dict[str, Callable[..., float]]:
    """Metrics by registered name or import path; an import path's metric is named after its
    attribute (``mypkg.metrics:within_half`` -> ``within_half``)."""
    out = {}
    for name in names:
        if is_import_path(name):
            out[name.rpartition(":")[2].rpartition(".")[2]] = load_object(name, "metric")
        else:
            out[name] = METRICS.get(name)
    return out


def load_data(config: TrainConfig) -> tuple[Dataset, Dataset | None, tuple[int, ...], int | None]:
    """``(train, eval, sample shape, classes)``; the shape and class count size a built-in model
    (None where the data set does not say)."""
    if not is_import_path(config.dataset):
        data_dir = Path(config.data_dir) if config.data_dir else None
        data = load_dataset(config.dataset, data_dir, config.seed)
        train = TensorDataset(data.train_x, data.train_y)
        test = TensorDataset(data.test_x, data.test_y)
        return train, test, data.sample_shape, data.num_classes
    train, test = load_user_data(config.dataset)
    return train, test, *infer_shape_and_classes(train)


def model_factory(
    config: TrainConfig, shape: tuple[int, ...], classes: int | None
) -> nn.Module | Callable[[], nn.Module]:
    if is_import_path(config.model):
        model = load_object(config.model, "model")
        if isinstance(model, nn.Module) or callable(model):
            return model
        raise TetherError(
            f"model {config.model!r} is a {type(model).__name__}: give an nn.Module, an nn.Module "
            "class or a function returning one"
        )
    if config.model == "mlp" and shape and classes is not None:
        shape = (1, 1, math.prod(shape))  # it flattens its input: features of any shape fit
    if len(shape) != 3 or classes is None:
        raise TetherError(
            f"built-in model {config.model!r} needs images (C, H, W) with class labels (mlp: "
            f"samples of any shape with class labels); the data set {config.dataset!r} has "
            f"{'samples of shape ' + str(shape) if shape else 'samples of unknown shape'}"
            f"{'' if classes is not None else ' and no class labels'}: give your own model as "
            "an import path (--model mypkg.nets:build)"
        )
    c, h, w = shape
    return partial(build_model, config.model, (c, h, w), classes)


def task_from_config(config: TrainConfig) -> Task:
    """Every component the config names, built (data loaded) in the calling process."""
    train, test, shape, classes = load_data(config)
    return Task(
        model=model_factory(config, shape, classes),
        train_data=train,
        eval_data=test,
        loss=loss_function(config),
        optimizer=optimizer_factory(config),
        scheduler=schedule_factory(config),
        metrics=metric_functions(config),
        loader_options={"num_workers": config.loader_workers} if config.loader_workers else {},
        model_name=config.model,
        data_name=config.dataset,
    )
