"""The optimizer and schedule a resume builds, against the state its checkpoint holds, checked in
the caller before any worker starts.

A named optimizer or schedule is a setting of the run's config, which the resume keeps
(:mod:`tether.resume_settings`). A user's own factories (``tether.fit``'s ``optimizer=`` and
``scheduler=``, an import path on the command line) are not: config.toml cannot say what they
build. Left out of a resume, or replaced, they built another optimizer than the checkpoint's (a
worker then failed on its state: ``KeyError: 'momentum'``), dropped the run's schedule without a
word, or took another rate that the restored param groups silently put back. So the state a
resume's factories build is compared with the checkpoint's: the optimizer's kind (the settings
its param groups hold), its settings where the user's factory makes them, and whether there is a
schedule, and of which kind.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tether.config import TrainConfig
from tether.errors import TetherError
from tether.methods import METHODS
from tether.optim import NamedOptimizer, NamedSchedule
from tether.optim.schedules import build_scheduler
from tether.training.build import run_length
from tether.training.checkpoint import SHARDS_DIR, load_shard
from tether.training.task import Task

# Settings every torch optimizer's param groups may hold that say nothing of its kind, and the
# rate, which a schedule moves (its start is initial_lr).
_ANY_KIND = {"params", "lr", "initial_lr", "weight_decay", "maximize", "foreach", "differentiable"}
_ANY_KIND |= {"capturable", "fused", "decoupled_weight_decay"}
_HOW = "give the run's own ({which}= in tether.fit, --{flag} on the command line)"


def check_resumed_state(
    run_dir: Path, state: dict[str, Any], config: TrainConfig, task: Task, model: nn.Module
) -> None:
    """One line (TetherError) where the optimizer or schedule the resume builds on ``model``
    could not take the checkpoint's ``state`` as the run's own."""
    saved = _saved_method_state(run_dir, state)
    if saved is None or not isinstance(saved.get("optimizer"), dict):
        return
    built = (
        task.optimizer(model.parameters())
        if task.optimizer is not None
        else METHODS.get(config.method).build_default_optimizer(model.parameters(), config)
    )
    own = task.optimizer is not None and not isinstance(task.optimizer, NamedOptimizer)
    _check_optimizer(run_dir, saved["optimizer"], built, own)
    if "optimizer_only" in saved and "scheduler" not in saved:
        return  # an asynchronous worker's, saved before its schedule's kind was kept with it
    try:  # at the run's length (a warm-up in epochs is none in a run of one-step epochs)
        length = run_length(config, len(task.train_data))  # type: ignore[arg-type]
        schedule = build_scheduler(task.scheduler, built, *length)
    except Exception:  # the probe of the task says what fails to build, in its own words
        return
    own_schedule = task.scheduler is not None and not isinstance(task.scheduler, NamedSchedule)
    _check_schedule(run_dir, saved.get("scheduler"), schedule, own_schedule)


def _saved_method_state(run_dir: Path, state: dict[str, Any]) -> dict[str, Any] | None:
    """The state of an optimizer the checkpoint holds: the method's in checkpoint.pt, else (a
    server's run, whose workers keep their own) a worker's shard's."""
    method = state.get("method")
    if isinstance(method, dict) and "optimizer" in method:
        return method
    for path in sorted((run_dir / SHARDS_DIR).glob("rank-*.pt")):
        # a torn shard is None: the resume says so, and starts that worker afresh
        shard = load_shard(run_dir, int(path.stem.removeprefix("rank-")), None)
        own = shard.get("optimizer_only") if shard is not None else None
        if isinstance(own, dict):
            return {**own, "optimizer_only": True}
        if shard is not None and isinstance(shard.get("method"), dict):
            return dict(shard["method"])
    return None


def _check_optimizer(
    run_dir: Path, saved: dict[str, Any], built: torch.optim.Optimizer, own: bool
) -> None:
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return
    new = built.state_dict()["param_groups"]
    if len(groups) != len(new):
        raise TetherError(
            f"cannot resume {run_dir}: its checkpoint's optimizer has {len(groups)} parameter "
            f"groups, the one this resume builds {len(new)}; "
            + _HOW.format(which="optimizer", flag="optimizer")
        )
    for had, has in zip(groups, new, strict=True):
        if _kind(had) != _kind(has):
            raise TetherError(
                f"cannot resume {run_dir}: its checkpoint holds the state of another optimizer "
                f"(with {_listed(_kind(had))}) than the one this resume builds (with "
                f"{_listed(_kind(has))}); " + _HOW.format(which="optimizer", flag="optimizer")
            )
    if not own:  # a named optimizer's settings are the config's, which the resume keeps
        return
    for had, has in zip(groups, new, strict=True):
        for key in sorted(set(has) - {"params", "initial_lr"}):
            before = had.get("initial_lr", had.get("lr")) if key == "lr" else had.get(key)
            if not _same(before, has[key]):
                raise TetherError(
                    f"cannot resume {run_dir} with an optimizer of {key} {has[key]!r}: the "
                    f"run's has {key} {before!r}, which its checkpointed state was made under "
                    "(torch would put it back); give the run's own optimizer, or start a new "
                    "run in another directory"
                )


def _check_schedule(
    run_dir: Path, saved: Any, built: torch.optim.lr_scheduler.LRScheduler | None, own: bool
) -> None:
    how = _HOW.format(which="scheduler", flag="lr-schedule")
    if saved is None and built is None:
        return
    if built is None:
        raise TetherError(
            f"cannot resume {run_dir} without a learning-rate schedule: the run had one, whose "
            f"position its checkpoint holds; {how}"
        )
    if not isinstance(saved, dict):
        raise TetherError(
            f"cannot resume {run_dir} with a learning-rate schedule: the run had none; leave "
            "it out, or start a new run in another directory"
        )
    had = _schedule_settings(saved)
    if own and _schedule_settings(built.state_dict()) != had:
        raise TetherError(
            f"cannot resume {run_dir} with {type(built).__name__}: the run's schedule was "
            f"another kind (with {_listed(had)}); {how}"
        )


def _schedule_settings(state: dict[str, Any]) -> set[str]:
    """What a schedule's state says of its kind: its settings, not its position."""
    return {key for key in state if not key.startswith("_")} - {"base_lrs", "last_epoch"}


def _kind(group: dict[str, Any]) -> set[str]:
    return set(group) - _ANY_KIND


def _listed(keys: set[str]) -> str:
    return ", ".join(sorted(keys)) or "no settings of its own"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float | int) and isinstance(b, float | int):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
