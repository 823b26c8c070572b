"""What a resumed run keeps of the run it continues: the run's saved config (``config.toml``) is
the resume's base, and the settings its checkpoint was made under may not change.

A checkpoint is more than weights: torch's optimizer state carries its param groups (the rate,
momentum, weight decay it was built with) and its per-parameter state (a velocity, Adam's
moments), a schedule its base rates and position, an fp16 run its loss scale, a method its own
state counted in its own units (a center pulled with alpha, rounds of tau steps), and the step a
position in the data order that the seed, the batch and accumulate define. A setting that changes
what those mean cannot take effect on a resume: another rate was silently overwritten by the
restored param groups (config.toml then claiming the new one), another optimizer failed in a
worker on the other's state, another accumulate skipped samples. So such a setting given with
another value than the run's is refused in one line, before any worker starts, by both
``tether train --resume`` and ``tether.fit(resume=True)`` (:func:`check_kept`); how long the
run goes on, how it evaluates, checkpoints, logs and communicates stay free.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tether.config import TrainConfig
from tether.config_sources import (
    OWN_OPTIMIZER_KEYS,
    OWN_SCHEDULE_KEYS,
    apply_overrides,
    load_toml,
)
from tether.errors import TetherError

# The settings a checkpoint was made under, by what they define. Not here: method, model,
# workers, batch_size and model_parallel, which the checkpoint itself records and the launcher
# checks against it (tether.training.run_dir.validate_checkpoint: the EASGD and parameter-server
# methods restart their workers from the center on another count); and everything a resume may
# change: steps, epochs, eval_every, checkpoint_every, target, timeout_s, progress, tensorboard,
# timeline, metrics, data_dir, backend and the collectives, threads, the fault injection.
KEPT = (
    # the optimizer and its rate (its param groups and state in the checkpoint)
    "optimizer",
    *OWN_OPTIMIZER_KEYS,
    "lr_batch",
    "async_base_workers",
    "global_batch_max",
    # the schedule (its base rates and position in the checkpoint)
    "lr_schedule",
    *OWN_SCHEDULE_KEYS,
    # the gradient an update takes (the loss scale in the checkpoint; the batch of an update)
    "loss",
    "label_smoothing",
    "clip_grad_norm",
    "precision",
    "loss_scale",
    "loss_scale_growth_interval",
    "loss_scale_growth",
    "loss_scale_backoff",
    "accumulate",
    # the method's own (the center, its rounds)
    "tau",
    "alpha",
    "rho",
    "staleness_bound",
    # the data the step indexes, and the layers the ranks' shards hold
    "dataset",
    "seed",
    "parallel_plan",
)
# A method's own: two-level-easgd's nodes, whose ranks hold one replica (their shards would
# put different replicas in one node) and whose rate counts a node's batch.
KEPT_BY_METHOD = {"two-level-easgd": ("ranks_per_node",)}


# An attempt's, not the run's: a fault injected into the run that crashed is not injected again
# into its resume (it would fail at the same step every time).
ATTEMPT_ONLY = {"fault_rank": -1, "fault_step": 0, "fault_kind": "raise"}


def saved_config(run_dir: Path, given: Iterable[str] = ()) -> TrainConfig:
    """The config of the run in ``run_dir``, the base of its resume, whose own settings are
    ``given`` (their keys). A length given in epochs alone replaces the run's: a run of
    ``steps`` would otherwise keep them (steps, once set, win over epochs)."""
    if not run_dir.is_dir():
        raise TetherError(f"cannot resume {run_dir}: no such directory (the run to continue)")
    path = run_dir / "config.toml"
    if not path.exists():
        raise TetherError(
            f"cannot resume {run_dir}: it holds no config.toml, so no Tether run (a run writes "
            "it as it starts)"
        )
    saved = {**load_toml(path), **ATTEMPT_ONLY}
    if "epochs" in given and "steps" not in given:
        saved.pop("steps", None)
    return apply_overrides(TrainConfig(), saved)


def check_kept(
    saved: TrainConfig, config: TrainConfig, run_dir: Path, unused: Iterable[str] = ()
) -> None:
    """Refuse ``config`` (a resume of the run in ``run_dir``, whose config was ``saved``) when a
    setting the checkpoint was made under has another value, naming each one and both values.
    ``unused``: settings the run does not read (a user's own optimizer sets its own rate), which
    the warning about ignored settings names instead: the run's value would mislead."""
    keys = [key for key in KEPT + KEPT_BY_METHOD.get(saved.method, ()) if key not in unused]
    changed = [key for key in keys if not _same(key, getattr(config, key), getattr(saved, key))]
    if not changed:
        return
    asked = ", ".join(f"{key} {_text(getattr(config, key))}" for key in changed)
    had = ", ".join(f"{key} {_text(getattr(saved, key))}{_scaled(key, saved)}" for key in changed)
    named, value = "them", "the run's"
    if len(changed) == 1:
        named, value = changed[0], _text(getattr(saved, changed[0]))
    raise TetherError(
        f"cannot resume {run_dir} with {asked}: the run has {had}, which its checkpointed "
        f"optimizer, schedule, method state and data position were made under; leave {named} "
        f"out (or give {value}) to continue it, or start a new run in another directory"
    )


def _scaled(key: str, saved: TrainConfig) -> str:
    """What a saved rate is, when the run scaled it to its batch: the config holds the rate at
    ``lr_base_batch``, not the one the optimizer took (summary.json's ``lr``), and a user who
    asks for the latter must see why it is refused (found by a docs review)."""
    if key != "lr" or not saved.lr_base_batch:
        return ""
    return (
        f" (its rate at a batch of lr_base_batch {saved.lr_base_batch}, which the run scales to "
        "its own batch: summary.json's lr is the one it took)"
    )


def _same(key: str, asked: Any, had: Any) -> bool:
    """Whether a kept setting has the run's value: a parallel plan as the layers it splits,
    however written (``"fc1=column, fc2=row"``, two entries, another order)."""
    if key == "parallel_plan" and asked != had:
        from tether.parallel.plan import parse_plan  # torch: only where plans differ in text

        return parse_plan(asked) == parse_plan(had)
    return bool(asked == had)


def _text(value: Any) -> str:
    """A value as the config file writes it (``'adamw'``, ``true``, ``['fc1=column']``)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return repr(list(value))
    return repr(value) if isinstance(value, str) else str(value)
