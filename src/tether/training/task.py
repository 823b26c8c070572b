"""A task: the user's components that a worker trains, as objects.

The trainer is built from a :class:`Task` and a config: the model (a module or a zero-argument
factory), the data (map-style ``torch.utils.data.Dataset`` s), the loss, optionally an optimizer
factory, a schedule factory and metrics. Where they come from is not the trainer's business:
``tether.fit`` gets them from the caller's Python objects (pickled to the worker processes), the
command line from names and import paths (:mod:`tether.catalog`, in each worker).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from tether.errors import TetherError

OptimizerFactory = Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
ScheduleFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]
"""``optimizer -> LRScheduler``; a factory with a ``total_steps`` parameter also gets the run's
length in optimizer steps (the named schedules need it)."""


@dataclass(frozen=True, eq=False)
class Task:
    """What to train and how to score it. ``optimizer`` None: the method's own local step;
    ``scheduler`` None: a constant learning rate; ``metrics`` None: the loss, plus accuracy for
    classifiers."""

    model: nn.Module | Callable[[], nn.Module]
    train_data: Dataset
    loss: Callable[..., torch.Tensor]
    eval_data: Dataset | None = None
    optimizer: OptimizerFactory | None = None
    scheduler: ScheduleFactory | None = None
    metrics: Mapping[str, Callable[..., float]] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    loader_options: Mapping[str, Any] = field(default_factory=dict)
    # Names for the summary and the progress line (the registered name, the import path, or
    # the class of the object).
    model_name: str = "model"
    data_name: str = "data"

    def build_model(self) -> nn.Module:
        """A fresh model: the factory's result, or a copy of the given module (the caller seeds
        first, so every worker builds the same initial weights)."""
        if isinstance(self.model, nn.Module):
            return copy.deepcopy(self.model)
        model = self.model()
        if not isinstance(model, nn.Module):
            raise TetherError(
                f"the model factory returned a {type(model).__name__}, not a torch.nn.Module"
            )
        return model


def describe(obj: object) -> str:
    """A short name for a user object: its function or class name."""
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return str(name)
