"""A model's training step as data: per layer, its gradient's bytes, its FLOPs and, where it was
timed, its forward and backward seconds; plus the optimizer update.

Shi, Wang and Chu's DAG model of synchronous SGD (seed 004) needs exactly this per layer: when
each gradient becomes ready in backward (``t_b``) and how large it is (the size of its
all-reduce). ``tether calibrate`` times a model's layers on the running machine
(:mod:`tether.bench.workload` measures; this module only holds the numbers). On another machine the
times come from the counted FLOPs and the profile's achieved FLOP/s (backward = 2x forward, the
usual count: one product for the input's gradient and one for the weight's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from tether.errors import TetherError
from tether.perf.checks import is_finite_number, is_whole
from tether.perf.profile import HardwareProfile


class TimedThreadsWarning(UserWarning):
    """``tether.predict`` for another thread count than a profile's layers were timed on
    (:meth:`Workload.timed_threads_note`); ``tether predict`` says it in its own words instead."""


@dataclass(frozen=True)
class LayerCost:
    """One layer (a module with parameters of its own; ``(other)`` gathers what has none)."""

    name: str
    tensor_bytes: tuple[int, ...]  # each parameter tensor's gradient, in registration order
    forward_flops: float  # at the workload's batch size
    forward_s: float = 0.0  # measured; 0 where not timed
    backward_s: float = 0.0  # from the previous layer's gradient being ready to this one's

    @property
    def param_bytes(self) -> int:
        return sum(self.tensor_bytes)


@dataclass(frozen=True)
class StepTimes:
    """The inputs of the DAG model for one worker: per layer in forward order."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    tensor_bytes: tuple[tuple[int, ...], ...]
    update_s: float
    data_s: float = 0.0  # the DAG's t_data: the batch and the training loop's own work

    @property
    def compute_s(self) -> float:
        """A worker's own work per step: data, forward, backward, update."""
        return self.data_s + sum(self.forward_s) + sum(self.backward_s) + self.update_s

    @property
    def layer_bytes(self) -> tuple[int, ...]:
        return tuple(sum(t) for t in self.tensor_bytes)

    @property
    def model_bytes(self) -> int:
        return sum(self.layer_bytes)

    def slowed(self, factor: float) -> StepTimes:
        """Every compute time times ``factor`` (workers sharing cores)."""
        return StepTimes(
            tuple(t * factor for t in self.forward_s),
            tuple(t * factor for t in self.backward_s),
            self.tensor_bytes,
            self.update_s * factor,
            self.data_s * factor,
        )


@dataclass(frozen=True)
class Workload:
    """``layers`` in forward order at ``batch_size`` samples per worker. ``measured_on`` names the
    profile whose machine timed the layers ("" when only FLOPs were counted), ``threads`` the
    threads per worker they were timed on (0: not recorded, a file from before it was)."""

    model: str
    batch_size: int
    layers: tuple[LayerCost, ...]
    update_s: float = 0.0
    measured_on: str = ""
    # per step outside the model's own step (the batch, the training loop's bookkeeping),
    # measured by running the trainer on one worker (tether calibrate); on the measuring
    # machine only, like the layer times
    data_s: float = 0.0
    threads: int = 0

    @property
    def parameters_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def forward_flops(self) -> float:
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def timed_step_s(self) -> float:
        """The model's own step as timed: every layer's forward and backward and the update
        (``data_s``, the training loop's share, left out)."""
        return sum(layer.forward_s + layer.backward_s for layer in self.layers) + self.update_s

    def at_batch(self, batch_size: int) -> Workload:
        """The same model at another per-worker batch: compute scales with the batch (the
        layers' work is per sample), the update does not."""
        if batch_size < 1:
            raise TetherError(f"batch size must be at least 1, not {batch_size}")
        k = batch_size / self.batch_size
        layers = tuple(
            replace(
                layer,
                forward_flops=layer.forward_flops * k,
                forward_s=layer.forward_s * k,
                backward_s=layer.backward_s * k,
            )
            for layer in self.layers
        )
        # data_s stays: at these sizes it is mostly the loop's fixed cost per step
        return replace(self, batch_size=batch_size, layers=layers)

    def same_layers(self, other: Workload) -> bool:
        """Whether ``other`` is the same model as far as a prediction can tell: the same layers
        (names, gradient tensors' bytes) and the same counted FLOPs per sample. A profile file
        names its model as its writer knew it (an import path from the command, a class name
        from Python), so the name alone cannot say whether its timed layers are this model's."""
        if [(x.name, x.tensor_bytes) for x in self.layers] != [
            (y.name, y.tensor_bytes) for y in other.layers
        ]:
            return False
        mine = self.forward_flops / self.batch_size
        theirs = other.forward_flops / other.batch_size
        return math.isclose(mine, theirs, rel_tol=1e-6)

    def timed_threads_note(self, profile: HardwareProfile, threads: int, option: str) -> str | None:
        """A line when predicting for ``threads`` per worker with layers timed on another count
        (``option`` spells the setting as the caller does: ``--threads-per-worker`` or
        ``threads_per_worker=``). The timed layers are used as they
        are while the worker is priced at ``threads`` cores, so more threads can only slow it:
        the prediction is not of a worker on that many threads."""
        if not (self.measured_on and self.measured_on == profile.name):
            return None  # counted FLOPs: the profile's FLOP/s are per worker, whatever it runs
        if self.threads == threads or (not self.threads and threads == 1):
            return None  # unrecorded (an older file) at the default 1: nothing to compare
        timed = f"on {self.threads}" if self.threads else "on an unrecorded number of"
        setting = f"{option}{threads}" if option.endswith("=") else f"{option} {threads}"
        return (
            f"note: profile {profile.name}'s layers were timed {timed} thread(s) per worker and "
            f"are used as timed at {setting}, which only counts more cores per worker: "
            f"calibrate with {setting} to predict that many threads"
        )

    def step_times(self, profile: HardwareProfile) -> StepTimes:
        """Measured times on the machine that measured them; elsewhere FLOPs / achieved FLOP/s,
        and the update as a read of weights and gradient and a write of weights per byte
        (three passes at the rate a reduction runs: ``3 * bytes * gamma``)."""
        if self.measured_on and self.measured_on == profile.name:
            return StepTimes(
                tuple(layer.forward_s for layer in self.layers),
                tuple(layer.backward_s for layer in self.layers),
                tuple(layer.tensor_bytes for layer in self.layers),
                self.update_s,
                self.data_s,
            )
        rate = profile.flops.value
        return StepTimes(
            tuple(layer.forward_flops / rate for layer in self.layers),
            tuple(2 * layer.forward_flops / rate for layer in self.layers),
            tuple(layer.tensor_bytes for layer in self.layers),
            3 * self.parameters_bytes * profile.gamma.value,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "batch_size": self.batch_size,
            "update_s": self.update_s,
            "data_s": self.data_s,
            "measured_on": self.measured_on,
            "threads": self.threads,
            "layers": [
                {**vars(layer), "tensor_bytes": list(layer.tensor_bytes)} for layer in self.layers
            ],
        }

    @staticmethod
    def from_dict(data: Any, where: str = "(given)") -> Workload:
        """Build and validate a workload (a profile file's ``workload``, as ``to_dict`` writes
        it); a missing or malformed field is a one-line TetherError naming it, as a profile's
        ``hardware`` is: a batch of 0 would divide by zero, a negative or NaN time would predict
        a negative or NaN iteration."""
        if not isinstance(data, dict):
            raise TetherError(
                f"workload {where}: expected a JSON object (as tether calibrate writes it), not "
                f"{type(data).__name__}"
            )
        layers = _field(data, "layers", where)
        if not isinstance(layers, list) or not all(isinstance(item, dict) for item in layers):
            raise TetherError(f"workload {where}: 'layers' must be a list of objects")
        return Workload(
            model=str(_field(data, "model", where)),
            batch_size=_count(_field(data, "batch_size", where), "batch_size", where, least=1),
            layers=tuple(_layer(item, f"layers[{i}]", where) for i, item in enumerate(layers)),
            update_s=_seconds(data.get("update_s", 0.0), "update_s", where),
            measured_on=str(data.get("measured_on", "")),
            data_s=_seconds(data.get("data_s", 0.0), "data_s", where),
            threads=_count(data.get("threads", 0), "threads", where),
        )


def _field(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise TetherError(
            f"workload {where}: missing field '{key}' (a workload needs model, batch_size and "
            "layers, each with name, tensor_bytes and forward_flops; tether calibrate writes one)"
        )
    return data[key]


def _count(value: Any, path: str, where: str, least: int = 0) -> int:
    if not is_whole(value) or value < least:
        raise TetherError(
            f"workload {where}: '{path}' must be a whole number >= {least}, not {value!r}"
        )
    return value


def _seconds(value: Any, path: str, where: str) -> float:
    """A time or a count of FLOPs: a finite number >= 0."""
    if not is_finite_number(value):
        raise TetherError(f"workload {where}: '{path}' must be a finite number, not {value!r}")
    if value < 0:
        raise TetherError(f"workload {where}: '{path}' must be >= 0, not {value}")
    return float(value)


def _layer(item: dict[str, Any], path: str, where: str) -> LayerCost:
    tensors = _field(item, "tensor_bytes", where)
    if not isinstance(tensors, list):
        raise TetherError(f"workload {where}: '{path}.tensor_bytes' must be a list of byte counts")
    return LayerCost(
        name=str(_field(item, "name", where)),
        tensor_bytes=tuple(
            _count(b, f"{path}.tensor_bytes[{k}]", where) for k, b in enumerate(tensors)
        ),
        forward_flops=_seconds(
            _field(item, "forward_flops", where), f"{path}.forward_flops", where
        ),
        forward_s=_seconds(item.get("forward_s", 0.0), f"{path}.forward_s", where),
        backward_s=_seconds(item.get("backward_s", 0.0), f"{path}.backward_s", where),
    )
