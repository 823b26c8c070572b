"""Learning-rate schedules by name (``--lr-schedule``), each with an optional linear warm-up.

A schedule is a ``torch.optim.lr_scheduler.LRScheduler`` stepped once per optimizer step (per
global update for the asynchronous methods). The named ones are one ``LambdaLR`` whose factor is
a linear warm-up from ``1 / warmup_steps`` to 1 over ``warmup_steps`` steps (Goyal et al., 2017,
"gradual warm-up"), followed by

- ``constant``: 1;
- ``step``: ``decay ** (s // decay_every)``, ``s`` counted after the warm-up;
- ``cosine``: ``0.5 * (1 + cos(pi * s / (total - warmup)))`` (Loshchilov and Hutter, SGDR,
  without restarts), reaching 0 at the last step;
- ``poly``: ``(1 - s / (total - warmup)) ** power`` (power 2 by default: Jia et al. 2018 train
  ResNet-50 at a 64k batch with LARS, warm-up and this decay), reaching 0 at the last step.

The warm-up is given in steps (``warmup_steps``) or in epochs (``warmup_epochs``, converted with
the run's steps per epoch). A user's own schedule comes as a factory ``optimizer ->
LRScheduler`` instead. :func:`linear_scaling` is the linear scaling rule (Goyal et al. 2017):
the rate for a global batch, from a rate tuned at a base batch.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tether.errors import TetherError
from tether.optim.hyper import require_in_range
from tether.registry import Registry


@dataclass(frozen=True)
class ScheduleSettings:
    """The run's schedule settings (config keys ``warmup_steps``, ``lr_decay_every``,
    ``lr_decay``) and its length in optimizer steps."""

    total_steps: int = 0
    warmup_steps: int = 0
    decay_every: int = 0
    decay: float = 0.1
    power: float = 2.0
    warmup_epochs: float = 0.0  # converted to steps (it adds to warmup_steps)

    def __post_init__(self) -> None:
        """Refuse what no schedule can follow (a negative power divides by zero at the end; a
        negative warm-up ramps the rate the wrong way), one value per message."""
        for name in ("total_steps", "warmup_steps", "decay_every"):
            value = getattr(self, name)
            whole = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not (whole and math.isfinite(value) and value >= 0 and float(value).is_integer()):
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy's integers, 1000.0: an int
        require_in_range("decay", self.decay, 0, above=True)
        require_in_range("power", self.power, 0, above=True)
        require_in_range("warmup_epochs", self.warmup_epochs, 0)


Factor = Callable[[ScheduleSettings, int], float]
"""``(settings, steps after the warm-up) -> factor`` of the base learning rate."""


def _constant(s: ScheduleSettings, step: int) -> float:
    return 1.0


def _step(s: ScheduleSettings, step: int) -> float:
    every = s.decay_every or max(1, (s.total_steps - s.warmup_steps) // 3)
    return float(s.decay ** (step // every))


def _cosine(s: ScheduleSettings, step: int) -> float:
    span = max(1, s.total_steps - s.warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(step, span) / span))


def _poly(s: ScheduleSettings, step: int) -> float:
    span = max(1, s.total_steps - s.warmup_steps)
    return float((1.0 - min(step, span) / span) ** s.power)


SCHEDULES: Registry[Factor] = Registry("learning-rate schedule")
SCHEDULES.register("constant", help="the learning rate as given (after any warm-up)")(_constant)
SCHEDULES.register(
    "step",
    help="x lr_decay every lr_decay_every steps (default: a third of the run after the warm-up)",
)(_step)
SCHEDULES.register("cosine", help="cosine decay to 0 at the last step")(_cosine)
SCHEDULES.register("poly", help="polynomial decay to 0, (1 - s/S)^lr_decay_power")(_poly)


class WarmupFactor:
    """``step -> factor``: linear warm-up, then the named schedule (counted from its end).

    It holds plain data only (the schedule's name and numbers): ``LambdaLR`` saves a callable
    object's attributes in its state_dict, and a checkpoint must hold nothing but tensors,
    numbers and strings to load with ``weights_only=True``."""

    def __init__(self, name: str, settings: ScheduleSettings) -> None:
        SCHEDULES.get(name)
        self.name = name
        self.total_steps = settings.total_steps
        self.warmup_steps = settings.warmup_steps
        self.decay_every = settings.decay_every
        self.decay = settings.decay
        self.power = settings.power

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        settings = ScheduleSettings(
            self.total_steps, self.warmup_steps, self.decay_every, self.decay, self.power
        )
        return SCHEDULES.get(self.name)(settings, step - self.warmup_steps)


def build_schedule(
    name: str, optimizer: torch.optim.Optimizer, settings: ScheduleSettings
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The named schedule over ``optimizer``; None for a constant rate without warm-up (nothing
    to step)."""
    SCHEDULES.get(name)  # an unknown name fails here, listing the valid ones
    if name == "constant" and settings.warmup_steps == 0:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupFactor(name, settings))


def warmup_length(steps: int, epochs: float, total_steps: int, steps_per_epoch: int) -> int:
    """The warm-up in optimizer steps: ``steps``, plus ``epochs`` converted (as cut: see
    :func:`epoch_warmup`); one in steps is taken as it is."""
    return steps + epoch_warmup(epochs, total_steps, steps_per_epoch)[1]


def epoch_warmup(epochs: float, total_steps: int, steps_per_epoch: int) -> tuple[int, int]:
    """A warm-up given in epochs, in steps: as asked, and as taken, at most a quarter of the
    run (the methods' default half epoch), so that a short run (--steps 30) still trains."""
    asked = round(epochs * steps_per_epoch)
    return asked, min(asked, total_steps // 4)


def schedule_name(scheduler: torch.optim.lr_scheduler.LRScheduler | None) -> str | None:
    """What summary.json calls a run's schedule: a named one's name (``poly``, as asked), else
    the scheduler's class (``SequentialLR``); None without one."""
    if scheduler is None:
        return None
    named = _named_factor(scheduler)
    return named.name if named is not None else type(scheduler).__name__


def warmup_of(scheduler: torch.optim.lr_scheduler.LRScheduler | None) -> int:
    """A named schedule's warm-up in steps, as it runs (0: none, or a user's own schedule)."""
    named = _named_factor(scheduler)
    return named.warmup_steps if named is not None else 0


def _named_factor(scheduler: torch.optim.lr_scheduler.LRScheduler | None) -> WarmupFactor | None:
    """The factor of a named schedule (a LambdaLR over a WarmupFactor), else None."""
    factors = getattr(scheduler, "lr_lambdas", [])
    return factors[0] if factors and isinstance(factors[0], WarmupFactor) else None


class NamedSchedule:
    """A factory ``(optimizer, total_steps, steps_per_epoch) -> LRScheduler`` for a registered
    name and the run's settings (an object, so it pickles to worker processes); the trainer
    passes the run's length and its steps per epoch (for a warm-up given in epochs)."""

    def __init__(self, name: str, settings: ScheduleSettings) -> None:
        SCHEDULES.get(name)  # an unknown name fails here, listing the valid ones
        self.name, self.settings = name, settings

    def __call__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, steps_per_epoch: int | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        if steps_per_epoch is None:  # (it was 1: a warm-up of one step for an epoch)
            if self.settings.warmup_epochs:
                raise ValueError(
                    f"a warm-up of {self.settings.warmup_epochs:g} epochs needs the steps in an "
                    "epoch: call it with steps_per_epoch=, or give the warm-up in warmup_steps"
                )
            steps_per_epoch = 1
        warmup = warmup_length(
            self.settings.warmup_steps, self.settings.warmup_epochs, total_steps, steps_per_epoch
        )
        settings = dataclasses.replace(
            self.settings, total_steps=total_steps, warmup_steps=warmup, warmup_epochs=0.0
        )
        return build_schedule(self.name, optimizer, settings)

    def __repr__(self) -> str:
        return f"NamedSchedule({self.name!r}, {self.settings})"


def linear_scaling(base_lr: float, global_batch: int, base_batch: int) -> float:
    """The linear scaling rule (Goyal et al. 2017): ``base_lr * global_batch / base_batch``, the
    rate for a global batch from one tuned at ``base_batch`` (use it with a warm-up)."""
    if base_batch < 1 or global_batch < 1:
        raise ValueError("batch sizes must be >= 1")
    return base_lr * global_batch / base_batch


def check_schedule(scheduler: object) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The scheduler, if a method can step it: one ``step()`` per update with no argument, and a
    position (``last_epoch``) to follow a global step. ``ReduceLROnPlateau`` needs a metric per
    step and ``ChainedScheduler`` / ``SequentialLR`` keep no single position: one line each."""
    if scheduler is None:
        return None
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise TetherError(
            "ReduceLROnPlateau steps on a metric, not once per update: step it yourself from "
            "your evaluation (do not pass it to Tether)"
        )
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) or not hasattr(
        scheduler, "last_epoch"
    ):
        raise TetherError(
            f"the scheduler is a {type(scheduler).__name__}: Tether steps torch "
            "LRSchedulers with a position (last_epoch); ChainedScheduler has none, use "
            "SequentialLR or a LambdaLR"
        )
    return scheduler


def build_scheduler(
    factory: Callable[..., Any] | None,
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    steps_per_epoch: int = 1,
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """A task's schedule over ``optimizer``: ``factory(optimizer)``, plus the run's length and
    steps per epoch for a factory that takes ``total_steps`` / ``steps_per_epoch`` (the named
    schedules do); checked."""
    if factory is None:
        return None
    try:
        wanted = set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        wanted = set()
    extra = {"total_steps": total_steps, "steps_per_epoch": steps_per_epoch}
    scheduler = factory(optimizer, **{k: v for k, v in extra.items() if k in wanted})
    return check_schedule(scheduler)
