"""Learning-rate schedules by name (``--lr-schedule``), each with an optional linear warm-up.

A schedule is a ``torch.optim.lr_scheduler.LRScheduler`` stepped once per optimizer step (per
global update for the asynchronous methods). The named ones are one ``LambdaLR`` whose factor is
a linear warm-up from ``1 / warmup_steps`` to 1 over ``warmup_steps`` steps (Goyal et al., 2017,
"gradual warm-up"), followed by

- ``constant``: 1;
- ``step``: ``decay ** (s // decay_every)``, ``s`` counted after the warm-up;
- ``cosine``: ``0.5 * (1 + cos(pi * s / (total - warmup)))`` (Loshchilov and Hutter, SGDR,
  without restarts), reaching 0 at the last step.

A user's own schedule comes as a factory ``optimizer -> LRScheduler`` instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tether.registry import Registry


@dataclass(frozen=True)
class ScheduleSettings:
    """The run's schedule settings (config keys ``warmup_steps``, ``lr_decay_every``,
    ``lr_decay``) and its length in optimizer steps."""

    total_steps: int = 0
    warmup_steps: int = 0
    decay_every: int = 0
    decay: float = 0.1


Factor = Callable[[int], float]


def _constant(s: ScheduleSettings) -> Factor:
    return lambda step: 1.0


def _step(s: ScheduleSettings) -> Factor:
    every = s.decay_every or max(1, (s.total_steps - s.warmup_steps) // 3)
    return lambda step: s.decay ** (step // every)


def _cosine(s: ScheduleSettings) -> Factor:
    span = max(1, s.total_steps - s.warmup_steps)
    return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, span) / span))


SCHEDULES: Registry[Callable[[ScheduleSettings], Factor]] = Registry("learning-rate schedule")
SCHEDULES.register("constant", help="the learning rate as given (after any warm-up)")(_constant)
SCHEDULES.register(
    "step", help="x lr_decay every lr_decay_every steps (default: a third of the run)"
)(_step)
SCHEDULES.register("cosine", help="cosine decay to 0 at the last step")(_cosine)


class WarmupFactor:
    """``step -> factor``: linear warm-up, then the named schedule (counted from its end).

    A class rather than a closure so that a scheduler built from it is an ordinary object;
    ``LambdaLR`` saves no function in its state_dict, only its position, which is what resume
    needs (the function is rebuilt from the config)."""

    def __init__(self, after: Factor, warmup_steps: int) -> None:
        self.after = after
        self.warmup_steps = warmup_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        return self.after(step - self.warmup_steps)


def build_schedule(
    name: str, optimizer: torch.optim.Optimizer, settings: ScheduleSettings
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The named schedule over ``optimizer``; None for a constant rate without warm-up (nothing
    to step)."""
    factor = SCHEDULES.get(name)(settings)
    if name == "constant" and settings.warmup_steps == 0:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupFactor(factor, settings.warmup_steps))


class NamedSchedule:
    """A factory ``(optimizer, total_steps) -> LRScheduler`` for a registered name and the run's
    settings (an object, so it pickles to worker processes); the trainer passes the run's length."""

    def __init__(self, name: str, settings: ScheduleSettings) -> None:
        SCHEDULES.get(name)  # an unknown name fails here, listing the valid ones
        self.name, self.settings = name, settings

    def __call__(
        self, optimizer: torch.optim.Optimizer, total_steps: int
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        settings = dataclasses.replace(self.settings, total_steps=total_steps)
        return build_schedule(self.name, optimizer, settings)

    def __repr__(self) -> str:
        return f"NamedSchedule({self.name!r}, {self.settings})"
