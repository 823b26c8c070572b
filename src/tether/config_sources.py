"""Where a run's config comes from: the defaults, a method's tuned defaults, a TOML file and
``--set key=value`` overrides, in that order, each value checked against the field's type
(:func:`resolve_config`). Every mistake is a one-line :class:`~tether.errors.TetherError`."""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from tether.config import TrainConfig
from tether.errors import TetherError
from tether.imports import is_import_path


def field_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _coerce(key: str, value: Any) -> Any:
    """Check ``value`` against the declared type of ``key``; ints are accepted for floats."""
    hint = _field_types()[key]
    if typing.get_origin(hint) is tuple:  # tuple[str, ...]: a list of strings (or one string)
        items = [value] if isinstance(value, str) else value
        if isinstance(items, list | tuple) and all(isinstance(v, str) for v in items):
            return tuple(items)
        raise TetherError(f"config key {key!r} must be a list of strings, got {value!r}")
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return None
    for typ in allowed:
        if typ is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if typ is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if typ in (str, bool) and isinstance(value, typ):
            return value
    names = " or ".join(t.__name__ for t in allowed if t is not type(None))
    raise TetherError(f"config key {key!r} must be {names}, got {value!r}")


OPTIONS_DOC = "docs/options.md"  # the reference of every key (a test keeps it complete)
# other frameworks' names for a key, which no spelling distance finds
OTHER_NAMES = {"learning_rate": "lr", "lr_scheduler": "lr_schedule", "scheduler": "lr_schedule"}


def apply_overrides(config: TrainConfig, values: Mapping[str, Any]) -> TrainConfig:
    """Return ``config`` with ``values`` applied; an unknown key is refused with the nearest
    ones (eighty would hide them) and where every key is described."""
    valid = field_names()
    changes = {}
    for key, value in values.items():
        if key not in valid:
            close = [OTHER_NAMES[key]] if key in OTHER_NAMES else []
            close = close or difflib.get_close_matches(key, valid, n=2, cutoff=0.6)
            meant = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise TetherError(f"unknown config key {key!r}{meant}; every key: {OPTIONS_DOC}")
        changes[key] = _coerce(key, value)
    return dataclasses.replace(config, **changes)


def parse_set_options(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values use TOML syntax (``lr=0.1``, ``data_dir="/x"``).

    A bare word that is not valid TOML (``method=sync-sgd``) is taken as a string, so users do
    not have to quote names on the command line.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise TetherError(f"--set expects key=value, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw.strip()
    return out


def load_toml(path: Path) -> dict[str, Any]:
    """Read a config file; any read or syntax problem is one TetherError naming the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TetherError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TetherError(f"config file {path} is not text (TOML is UTF-8)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TetherError(f"config file {path} is not valid TOML: {exc}") from None


# a method's defaults that belong to its own rate, dropped when the user gives one (the held
# global batch too: a rate given for a worker's batch of 64 is not run at 16, where the
# method's own rate had to shrink to stay stable)
OWN_RATE_KEYS = (
    "lr_base_batch",
    "lr_scaling",
    "lr_scale_max",
    "warmup_epochs",
    "clip_grad_norm",
    "async_base_workers",
    "global_batch_max",
)


# what a user's own optimizer or schedule (an object, or an import path) sets for itself: the
# run's values for them go unused (tether.ignored_settings), and a resume may change them
# (tether.resume_settings)
OWN_OPTIMIZER_KEYS = (
    "lr",
    "momentum",
    "nesterov",
    "weight_decay",
    "lars_eta",
    "trust_exclude",
    "lr_base_batch",
    "lr_scaling",
    "lr_scale_max",
)
OWN_SCHEDULE_KEYS = (
    "warmup_steps",
    "warmup_epochs",
    "lr_decay_every",
    "lr_decay",
    "lr_decay_power",
)


HELD_WORKERS = 8  # global_batch_max is held up to this many workers, then grows with them


def held_batch_size(config: TrainConfig) -> int:
    """The per-worker batch under ``global_batch_max`` (0: ``batch_size`` as it is): as workers
    are added, ``global_batch_max // P`` for P data workers once ``batch_size * P`` exceeds it,
    not below ``global_batch_max // 8`` (the global batch grows again beyond 8 workers)."""
    cap, workers = config.global_batch_max, config.data_workers
    if not cap or config.batch_size * workers <= cap:
        return config.batch_size
    return max(cap // workers, min(max(1, cap // HELD_WORKERS), config.batch_size))


def resolve_config(
    file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    base: TrainConfig | None = None,
    method_defaults: Callable[[str], Mapping[str, Any]] | None = None,
) -> TrainConfig:
    """Defaults (or ``base``) <- the method's own defaults <- config file <- explicit overrides,
    validated. ``method_defaults(name)`` gives a method's tuned defaults (e.g. a larger learning
    rate for plain-SGD local steps, scaled with the batch); they apply only to keys that the
    file and the overrides leave unset, and only when starting from the defaults (a resumed
    run's config has them). A rate or a base batch the user gives drops the method's scaling,
    warm-up, clipping, damping and held batch (a momentum the user gives, the damping): ``--lr
    0.05`` means 0.05 from the first step, on the gradient as it is, at a batch of 64 per
    worker. Unless the batch size is given, a ``global_batch_max`` shrinks the per-worker batch
    with the workers (:func:`held_batch_size`)."""
    given = dict(load_toml(file)) if file is not None else {}
    given.update(overrides or {})
    config = base or TrainConfig()
    method = given.get("method", config.method)
    if base is None and method_defaults is not None and isinstance(method, str):
        defaults = dict(method_defaults(method))
        own = [given.get(key) for key in ("optimizer", "lr_schedule")]
        own_rate = any(isinstance(v, str) and is_import_path(v) for v in own)
        if "lr" in given or "lr_base_batch" in given or own_rate:
            # The method's scaling, warm-up and clip are for its own rate: a rate given alone
            # is taken as it is, and one given with a base batch scales by the user's rule. A
            # user's own optimizer or schedule (an import path; tether.fit's objects likewise)
            # sets its own rate.
            for key in OWN_RATE_KEYS:
                defaults.pop(key, None)
        if "momentum" in given and "momentum" in defaults:
            # the damping takes from the method's own momentum first: the user's stays (a
            # method without one, async-sgd, damps its rate and ignores a momentum given)
            defaults.pop("async_base_workers", None)
        config = apply_overrides(config, defaults)
    config = apply_overrides(config, given).validate()
    if base is None and "batch_size" not in given:
        config = dataclasses.replace(config, batch_size=held_batch_size(config))
    return config
