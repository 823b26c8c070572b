"""Run configuration: one frozen dataclass, TOML loading, ``--set key=value`` overrides, validation.

A config is data only: process groups, modules and optimizers are runtime arguments, never fields
(DESIGN.md convention 1). Variants are made with :func:`dataclasses.replace`. Every mistake a user
can make here is a :class:`~tether.errors.TetherError` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import tomli_w

from tether.errors import TetherError

BACKENDS = ("auto", "gloo", "nccl")
COMPRESSIONS = ("none", "fp16", "bf16")
FAULT_KINDS = ("raise", "kill", "hang")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run. Field names are the TOML keys and ``--set`` keys."""

    method: str = "sync-easgd"
    workers: int = 2
    model: str = "lenet5"
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    epochs: int = 1
    # When set, the run length in optimizer steps; it takes precedence over epochs.
    steps: int | None = None
    batch_size: int = 64  # per worker; the global batch is batch_size * workers
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 0
    target_accuracy: float | None = None
    stop_at_target: bool = False
    # Evaluate every this many steps; 0 picks about four evaluations per epoch.
    eval_every: int = 0
    out: str | None = None
    backend: str = "auto"
    # Gradient fusion bucket size in MiB; 0 sends one message per parameter (no fusion).
    bucket_mb: float = 1.0
    # Collective algorithm for the gradient / parameter all-reduce of sync-sgd, sync-easgd and
    # local-sgd: a name from `tether list` (collectives), or "auto" (per message size, the fastest
    # as timed by a calibration of the running group), or "native" (the backend's own).
    allreduce: str = "native"
    # Wire format of those all-reduces: "none" (the parameters' dtype), "fp16" or "bf16"
    # (pre-divided by the number of workers so that fp16 sums cannot overflow).
    compress: str = "none"
    # Ranks per node for the hierarchical collective; 0 takes the launcher's local world size.
    ranks_per_node: int = 0
    # Write DIR/timeline.json, a Chrome trace of compute and communication per rank.
    timeline: bool = False
    checkpoint_every: int = 0
    # Elastic averaging (EASGD family): alpha directly, or rho with alpha = lr * rho; neither
    # gives the EASGD paper's beta = workers * alpha = 0.9.
    alpha: float | None = None
    rho: float | None = None
    # Communication period in local steps (EASGD exchanges, local-sgd averaging, async pushes).
    tau: int = 1
    # async-sgd/msgd: drop gradients computed on weights more than this many updates old.
    staleness_bound: int | None = None
    # sync-easgd co-design switches (SC17 section 5): overlap the round's all-reduce with the
    # next local steps; send all layers as one flat message (False: one message per layer).
    overlap: bool = True
    single_message: bool = True
    # Set by `--resume DIR`: continue the run whose checkpoint is in DIR (and write there).
    resume: bool = False
    # Collective / point-to-point timeout: a hung peer turns into an error after this long.
    timeout_s: float = 60.0
    progress: bool = True
    # Fault injection for reliability tests: rank `fault_rank` fails at step `fault_step`
    # (-1: no fault). Kinds: raise an exception, kill -9 itself, or hang forever.
    fault_rank: int = -1
    fault_step: int = 0
    fault_kind: str = "raise"

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.workers

    def validate(self) -> TrainConfig:
        """Check ranges and names; returns self so calls chain. Raises TetherError on bad input."""
        _require(self.workers >= 1, f"workers must be >= 1, got {self.workers}")
        _require(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        _require(self.lr > 0, f"lr must be > 0, got {self.lr}")
        _require(0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}")
        _require(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        _require(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        _require(self.steps is None or self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        _require(self.eval_every >= 0, f"eval_every must be >= 0, got {self.eval_every}")
        _require(self.bucket_mb >= 0, f"bucket_mb must be >= 0, got {self.bucket_mb}")
        _require(
            self.checkpoint_every >= 0,
            f"checkpoint_every must be >= 0, got {self.checkpoint_every}",
        )
        _require(self.tau >= 1, f"tau must be >= 1, got {self.tau}")
        if self.alpha is not None:
            _require(0 < self.alpha < 1, f"alpha must be in (0, 1), got {self.alpha}")
        if self.rho is not None:
            _require(self.rho > 0, f"rho must be > 0, got {self.rho}")
        if self.staleness_bound is not None:
            _require(self.staleness_bound >= 0, "staleness_bound must be >= 0")
        _require(self.timeout_s > 0, f"timeout_s must be > 0, got {self.timeout_s}")
        _require(
            self.compress in COMPRESSIONS,
            f"compress must be one of {', '.join(COMPRESSIONS)}, got {self.compress!r}",
        )
        _require(
            self.ranks_per_node >= 0, f"ranks_per_node must be >= 0, got {self.ranks_per_node}"
        )
        if self.ranks_per_node:
            _require(
                self.workers % self.ranks_per_node == 0,
                f"workers ({self.workers}) must be a multiple of ranks_per_node "
                f"({self.ranks_per_node})",
            )
        _require(self.backend in BACKENDS, f"backend must be one of {', '.join(BACKENDS)}")
        _require(
            self.fault_kind in FAULT_KINDS, f"fault_kind must be one of {', '.join(FAULT_KINDS)}"
        )
        if self.target_accuracy is not None:
            _require(
                0 < self.target_accuracy <= 1,
                f"target_accuracy is a fraction in (0, 1], got {self.target_accuracy}"
                " (write 0.88 for 88%)",
            )
        # Names are checked against the registries so a typo fails before any process starts.
        from tether.data import DATASETS
        from tether.methods import METHODS
        from tether.models import MODELS

        METHODS.get(self.method)
        from tether.comm.collectives import collectives_for

        valid = ["auto", *collectives_for("all_reduce")]
        _require(
            self.allreduce in valid,
            f"unknown all-reduce algorithm {self.allreduce!r}; valid: {', '.join(valid)}",
        )
        MODELS.get(self.model)
        DATASETS.get(self.dataset)
        return self

    def to_toml(self) -> str:
        # TOML has no null: unset optional fields are simply absent and read back as None.
        data = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return tomli_w.dumps(data)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise TetherError(message)


def field_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _coerce(key: str, value: Any) -> Any:
    """Check ``value`` against the declared type of ``key``; ints are accepted for floats."""
    hint = _field_types()[key]
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


def apply_overrides(config: TrainConfig, values: Mapping[str, Any]) -> TrainConfig:
    """Return ``config`` with ``values`` applied; unknown keys list the valid ones."""
    valid = field_names()
    changes = {}
    for key, value in values.items():
        if key not in valid:
            raise TetherError(f"unknown config key {key!r}; valid keys: {', '.join(valid)}")
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
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TetherError(f"config file {path} is not valid TOML: {exc}") from None


def resolve_config(
    file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    base: TrainConfig | None = None,
) -> TrainConfig:
    """Defaults (or ``base``) <- the method's own defaults <- config file <- explicit overrides,
    validated. A method's defaults (e.g. a larger learning rate for plain-SGD local steps) apply
    only to keys that the file and the overrides leave unset."""
    given = dict(load_toml(file)) if file is not None else {}
    given.update(overrides or {})
    config = base or TrainConfig()
    if base is None:
        config = apply_overrides(config, method_defaults(given.get("method", config.method)))
    return apply_overrides(config, given).validate()


def method_defaults(method: object) -> dict[str, Any]:
    """The tuned defaults a method declares (empty for an unknown name: validation reports it)."""
    from tether.methods import METHODS

    if not isinstance(method, str) or method not in METHODS:
        return {}
    return dict(METHODS.get(method).defaults)
