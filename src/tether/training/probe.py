"""A dry run of a task on two training samples, in the calling process, before any worker starts.

A model that fails on the data, a loss that returns a vector, a metric that raises: each would
otherwise surface as the same traceback from every worker, after the start-up. Running the task
once on a tiny batch turns them into one line (a :class:`~tether.errors.TetherError`) up front.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import default_collate

from tether.config import TrainConfig
from tether.errors import TetherError, first_line
from tether.optim import check_distributable
from tether.optim.schedules import build_scheduler
from tether.targets import Target
from tether.training.build import run_length
from tether.training.evaluation import Evaluator
from tether.training.objective import Objective, takes_model_and_batch
from tether.training.task import Task, describe


def unseeded_model(task: Task) -> torch.nn.Module:
    """The task's model, built without changing the caller's random state (for checks of its
    names and shapes)."""
    with torch.random.fork_rng(devices=[]):
        return build_model(task)


def build_model(task: Task) -> torch.nn.Module:
    """The task's model, a failure of the user's factory in one line (a TetherError)."""
    try:
        return task.build_model()
    except TetherError:
        raise
    except Exception as exc:
        raise TetherError(
            f"building the model ({describe(task.model)}) failed: {first_line(exc)}"
        ) from None


def probe_task(
    task: Task,
    samples: int = 2,
    model: torch.nn.Module | None = None,
    target: Target | None = None,
    config: TrainConfig | None = None,
) -> None:
    """Build the model (or take ``model``, the caller's :func:`unseeded_model`) and run
    forward, the loss and every metric on ``samples`` training samples (collated as the workers
    will), without changing the caller's random state; ``target`` must name a metric the run
    will evaluate (a target nothing measures would never be reached, and say nothing). With
    the run's ``config``, a schedule is built for the run's length, as the workers will."""
    if "loss" in (task.metrics or {}):
        raise TetherError(
            "a metric cannot be named 'loss': the run's mean loss has that name (rename it)"
        )
    try:
        size = len(task.train_data)  # type: ignore[arg-type]
    except TypeError:
        raise TetherError(
            "train_data must be a map-style dataset (with __len__ and __getitem__)"
        ) from None
    if size == 0:
        raise TetherError("train_data is empty")
    if model is None:
        model = unseeded_model(task)
    with torch.random.fork_rng(devices=[]):
        try:
            items = [task.train_data[i] for i in range(min(samples, size))]
            batch: Any = (task.collate_fn or default_collate)(items)
        except Exception as exc:
            raise TetherError(f"reading a batch of train_data failed: {first_line(exc)}") from None
        if task.optimizer is not None or task.scheduler is not None:
            # the optimizer and schedule factories, on this model (a schedule alone, on a
            # stand-in for the method's own optimizer)
            building = "the optimizer (optimizer(params))"  # which factory failed, and its form
            try:
                optimizer = (
                    task.optimizer(model.parameters())
                    if task.optimizer is not None
                    else torch.optim.SGD(model.parameters(), lr=0.1)
                )
                check_distributable(optimizer)
                building = "the schedule (scheduler(optimizer) or (optimizer, total_steps))"
                build_scheduler(task.scheduler, optimizer, *run_length(config, size))
            except TetherError:
                raise
            except Exception as exc:
                raise TetherError(f"building {building} failed: {first_line(exc)}") from None
        objective = Objective(task.loss)
        model.eval()
        with torch.no_grad():
            try:
                result = objective(model, batch)
            except TetherError:
                raise
            except Exception as exc:
                raise TetherError(
                    f"the model and loss failed on a batch of train_data: {first_line(exc)}"
                ) from None
            for name, metric in (task.metrics or {}).items():
                try:
                    value = (
                        metric(model, batch)
                        if takes_model_and_batch(metric)
                        else metric(result.outputs, result.targets)
                    )
                    float(value)
                except Exception as exc:
                    raise TetherError(f"metric {name!r} failed: {first_line(exc)}") from None
            evaluated = Evaluator(objective, task.metrics).names_for(result.outputs, result.targets)
    if target is not None:
        if task.eval_data is None:
            raise TetherError(f"target {target} needs eval_data: without it nothing is evaluated")
        if target.metric not in evaluated:
            raise TetherError(
                f"the target's metric {target.metric!r} is not evaluated in this run; "
                f"evaluated: {', '.join(evaluated)} (add it to the metrics)"
            )
