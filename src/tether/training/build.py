"""From a task and a config to a method bound to the model: what the trainer and ``ctx.wrap``
would each otherwise spell out."""

from __future__ import annotations

import torch

from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.methods import METHODS, MethodContext, Placement, TrainingMethod
from tether.optim.schedules import build_scheduler, schedule_name, warmup_of
from tether.parallel import ProcessGrid
from tether.training.model_parallel import shard_model
from tether.training.random_state import seed_generators
from tether.training.task import Task


def computing_workers(config: TrainConfig, world_size: int) -> int:
    """The ranks that compute gradients: all of them, but a parameter server."""
    return world_size - METHODS.get(config.method).server_processes


def steps_per_epoch(config: TrainConfig, samples: int, workers: int) -> int:
    """Optimizer steps per epoch: whole global batches of ``batch_size * workers``, grouped by
    ``accumulate``; a one-line error when one update would need more than the data set."""
    steps = samples // (config.batch_size * workers) // config.accumulate
    if steps < 1:
        raise TetherError(
            f"one optimizer step takes {config.accumulate} batches of {config.batch_size} x "
            f"{workers} samples, more than the {samples} training samples: lower accumulate "
            "or batch_size"
        )
    return steps


def planned_steps(config: TrainConfig, per_epoch: int) -> int:
    """The run's length in optimizer steps: ``steps`` where set, else its epochs'."""
    return config.steps if config.steps is not None else config.epochs * per_epoch


def known_run_length(config: TrainConfig, samples: int) -> tuple[int, int] | None:
    """(total steps, steps per epoch) of the run, as its workers count them; None where there
    is no step to take (too little data: said elsewhere, in its own words)."""
    try:
        per_epoch = steps_per_epoch(config, samples, config.data_workers)
    except TetherError:
        return None
    return planned_steps(config, per_epoch), per_epoch


def run_length(config: TrainConfig | None, samples: int) -> tuple[int, int]:
    """:func:`known_run_length`, or (1, 1) where unknown (no config, no step to take)."""
    length = known_run_length(config, samples) if config is not None else None
    return length if length is not None else (1, 1)


def build_method(
    config: TrainConfig,
    task: Task,
    transport: TorchTransport,
    device: torch.device,
    placement: Placement,
    total_steps: int,
    epoch_steps: int,
    grid: ProcessGrid | None = None,
) -> TrainingMethod:
    """The task's model (seeded the same on every rank: replicas start identical, and methods
    broadcast rank 0's anyway; under model parallelism each rank then keeps its slices of the
    layers the plan splits), its optimizer (the task's factory, or the method's own local step)
    and schedule, and the method around them, over ``transport`` (the data-parallel group's
    under model parallelism); not started."""
    method_cls = METHODS.get(config.method)
    seed_generators(config.seed)  # torch's, Python's and NumPy's
    model = shard_model(task.build_model(), config, grid).to(device)
    optimizer = (
        task.optimizer(model.parameters())
        if task.optimizer is not None
        else method_cls.build_default_optimizer(model.parameters(), config)
    )
    scheduler = build_scheduler(task.scheduler, optimizer, total_steps, epoch_steps)
    context = MethodContext(config, transport, device, placement, grid)
    return method_cls(model, context, optimizer, scheduler)


def uses_momentum(config: TrainConfig) -> bool:
    """Whether the run's local step has a momentum: a named SGD or LARS optimizer, or the
    method's own step when it declares the setting."""
    if config.optimizer != "auto":
        return config.optimizer in ("sgd", "lars")
    return "momentum" in METHODS.get(config.method).settings


def initial_lr(optimizer: torch.optim.Optimizer | None, fallback: float) -> float:
    """The rate the optimizer started from (a schedule's base; a user's own optimizer's own)."""
    if optimizer is None or not optimizer.param_groups:
        return fallback
    group = optimizer.param_groups[0]
    return float(group.get("initial_lr", group.get("lr", fallback)))


def run_settings(
    config: TrainConfig,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> dict[str, object]:
    """The settings the run's method actually uses, for its summary and comparison row: the
    learning rate and momentum as ``optimizer`` took them (scaled or damped defaults, or a
    user's own optimizer's; no momentum for one without it, Adam), the per-worker batch, the
    method's own settings that are set (tau, alpha, rho, ...), and where they are on, a
    schedule, its warm-up in steps (as cut: a method's default half epoch), gradient clipping,
    accumulation and a precision other than fp32."""
    group = optimizer.param_groups[0] if optimizer is not None and optimizer.param_groups else {}
    lr = initial_lr(optimizer, config.scaled_lr)
    settings: dict[str, object] = {"lr": lr, "batch_size": config.batch_size}
    if uses_momentum(config) and (not group or "momentum" in group):
        settings["momentum"] = group.get("momentum", config.momentum)
    for key in sorted(METHODS.get(config.method).settings):
        value = getattr(config, key, None)
        if value is not None and key != "momentum":
            settings[key] = value
    name, warmup = schedule_name(scheduler), warmup_of(scheduler)
    settings |= {"lr_schedule": name} if name not in (None, "constant") else {}
    settings |= {"warmup_steps": warmup} if warmup else {}
    settings |= {"clip_grad_norm": config.clip_grad_norm} if config.clip_grad_norm else {}
    settings |= {"accumulate": config.accumulate} if config.accumulate > 1 else {}
    settings |= {"precision": config.precision} if config.precision != "fp32" else {}
    return settings
