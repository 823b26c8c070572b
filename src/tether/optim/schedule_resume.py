"""A checkpointed learning-rate schedule restored in a resumed run, which may be longer.

A resume may change the run's length (more epochs, other steps per epoch on another worker
count). Restored whole, a schedule built for the saved length would take the rate to 0 where the
shorter run ended; and the optimizer's own restored rate is the saved shape's. So a schedule is
restored at its position (its step) in this run's shape, and the optimizer's rate follows it:

- a named one (:mod:`tether.optim.schedules`) keeps this run's warm-up and length;
- a user's whose shape is the saved one (a factory that ignores the run's length) is restored
  whole; one whose shape differs (a factory given ``total_steps``) is rebuilt from its first
  state (:class:`ScheduleStart`) and stepped to the saved step, as this run would have stepped it.

The base rates are the checkpoint's either way: a resumed run's rate is its checkpoint's, even
where this run's defaults would pick another (a parameter-server method's do for another worker
count).
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any

import torch

from tether.optim.schedules import WarmupFactor


class ScheduleStart:
    """A schedule as this run built it, before its first step (taken as a restore begins,
    before the optimizer's state is loaded over its rates): what a resume replays to the saved
    position when the run's shape differs from the checkpoint's (a factory given this run's
    length builds another schedule than the saved run's)."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        self.rates = [group["lr"] for group in scheduler.optimizer.param_groups]
        try:
            self.state: dict[str, Any] | None = copy.deepcopy(scheduler.state_dict())
        except (TypeError, ValueError, RuntimeError, copy.Error):  # a factor holding a lock...
            self.state = None  # then restored whole, as saved


# What moves as a schedule steps (its position), and its base rates (the checkpoint's stay):
# the rest of its state is its shape.
_NOT_SHAPE = frozenset(
    {"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial"}
    | {"base_lrs"}
)


def _shape(state: dict[str, Any]) -> dict[str, Any]:
    shape = {k: v for k, v in state.items() if k not in _NOT_SHAPE}
    if "_schedulers" in shape:  # SequentialLR and ChainedScheduler: their members' shapes
        shape["_schedulers"] = [_shape(member) for member in shape["_schedulers"]]
    return shape


def _same_shape(saved: dict[str, Any], fresh: dict[str, Any]) -> bool:
    try:
        return bool(_shape(saved) == _shape(fresh))
    except (RuntimeError, TypeError, ValueError):  # a factor holding tensors: not comparable
        return True  # restored whole, as saved


def load_schedule_state(
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    start: ScheduleStart | None = None,
) -> None:
    """Restore ``state`` into ``scheduler`` at its position, in this run's shape (see the
    module docstring), and set the optimizer's rates to the schedule's there; ``start``: the
    scheduler as this run built it, which a schedule of another shape is replayed from."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    _keep_finished_warmups(state, lambdas)
    saved = _named_free(state, lambdas)
    fresh = None if start is None or start.state is None else _named_free(start.state, lambdas)
    if start is not None and fresh is not None and not _same_shape(saved, fresh):
        base, own = _base_of(saved), _base_of(fresh)
        rates = start.rates
        if base is not None and own is not None:  # this run's first rates, at the saved base
            rates = [r * b / o if o else r for r, b, o in zip(rates, base, own, strict=True)]
            fresh = _with_base(fresh, base)
        _replay(scheduler, fresh, rates, int(saved["last_epoch"]))
        return
    scheduler.load_state_dict(saved)
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):  # a closed form of the step
        at, factors = scheduler.last_epoch, scheduler.lr_lambdas
        follow_schedule(
            scheduler, [b * f(at) for b, f in zip(scheduler.base_lrs, factors, strict=True)]
        )


def _keep_finished_warmups(state: dict[str, Any], lambdas: list[Any] | None) -> None:
    """A named schedule whose warm-up the saved run had finished keeps it finished: this run's
    warm-up is not longer than the saved one (one given in epochs is cut to a quarter of the
    run, so a resume that lengthens the run lengthened it, and the rate went back into a
    warm-up it had done)."""
    position = int(state.get("last_epoch", 0))
    for factor, saved in zip(lambdas or [], state.get("lr_lambdas") or [], strict=False):
        if not isinstance(factor, WarmupFactor) or not isinstance(saved, dict):
            continue
        done = int(saved.get("warmup_steps", 0))
        if position >= done and factor.warmup_steps > done:
            factor.warmup_steps = done


def _named_free(state: dict[str, Any], lambdas: list[Any] | None) -> dict[str, Any]:
    """``state`` without the named schedules' factors (their shape is this run's, not the
    saved one's): loaded, a factor's None keeps it as it is."""
    if lambdas is None or "lr_lambdas" not in state:
        return dict(state)
    named = [
        None if isinstance(fn, WarmupFactor) else s
        for fn, s in zip(lambdas, state["lr_lambdas"], strict=True)
    ]
    return {**state, "lr_lambdas": named}


def _base_of(state: dict[str, Any]) -> list[float] | None:
    """A schedule's base rates, or its first member's (SequentialLR keeps none of its own)."""
    if "base_lrs" in state:
        return list(state["base_lrs"])
    members = state.get("_schedulers") or [{}]
    return _base_of(members[0]) if members[0] else None


def _with_base(state: dict[str, Any], base: list[float]) -> dict[str, Any]:
    """``state`` with ``base`` for its base rates (its members' too: SequentialLR)."""
    state = {**state, "base_lrs": list(base)} if "base_lrs" in state else dict(state)
    if "_schedulers" in state:
        state["_schedulers"] = [_with_base(member, base) for member in state["_schedulers"]]
    return state


def _replay(
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    fresh: dict[str, Any],
    rates: list[float],
    steps: int,
) -> None:
    """Put ``scheduler`` back to its first state (``fresh``; the optimizer's ``rates`` then),
    and step it ``steps`` times."""
    scheduler.load_state_dict(copy.deepcopy(fresh))
    _set_rates(scheduler.optimizer, rates)
    step_schedule_to(scheduler, steps)


def step_schedule_to(scheduler: torch.optim.lr_scheduler.LRScheduler, step: int) -> None:
    """Step ``scheduler`` until it has seen ``step`` steps, before the optimizer's next step
    (a resume, a worker that follows the run's global step): torch's warning about a scheduler
    stepped before its optimizer does not apply."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", re.escape("Detected call of `lr_scheduler.step()`"))
        while scheduler.last_epoch < step:
            scheduler.step()


def _set_rates(optimizer: torch.optim.Optimizer, rates: list[Any]) -> None:
    """As torch's schedulers set them: a rate held in a tensor (a capturable or fused
    optimizer's) is filled in place, so that what holds the tensor sees the new value."""
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(float(rate))
        else:
            group["lr"] = rate


def follow_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler, rates: Any = None) -> None:
    """Set the optimizer's rates to the schedule's (``rates``, or its last ones): after a
    restore of the optimizer's state, whose rates were the saved run's."""
    rates = list(scheduler.get_last_lr() if rates is None else rates)
    _set_rates(scheduler.optimizer, rates)
    scheduler._last_lr = rates  # what get_last_lr() returns
