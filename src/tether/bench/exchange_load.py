"""The exchange under load for ``tether calibrate``: what a collective costs in training beyond
the idle links' price (:mod:`tether.perf.exchange_load` says what the two numbers mean).

Two short sync-sgd runs without overlap on the calibration's workers, one fused (few messages
per step) and one with a message per tensor (many), are timed in each round of the
calibration; the medians' excess over what the idle profile predicts for each is linear in the
two unknowns (per message, per exchange), so two runs that differ in their message count
separate them. Without overlap the prediction is a plain sum, so the coefficients are exact.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field

from tether.bench.compute_samples import LoopTimer
from tether.errors import TetherError
from tether.perf.predict import Setup, predict
from tether.perf.profile import ExchangeLoad, HardwareProfile, Sourced
from tether.perf.workload import Workload

FUSED_MB = 25.0  # one bucket for the models one calibrates on a CPU: the fewest messages
PER_TENSOR_MB = 0.0  # a message per tensor: the most
_PROBE = 1e-3  # a unit of load (seconds) to read the prediction's coefficients with


@dataclass
class ExchangeSamples:
    """Step times of the two runs, one pair per round of the calibration."""

    loops: LoopTimer
    workers: int
    fused: list[float] = field(default_factory=list)
    per_tensor: list[float] = field(default_factory=list)

    def take(self) -> None:
        self.fused.append(self.loops.exchanging(self.workers, FUSED_MB).step_s)
        self.per_tensor.append(self.loops.exchanging(self.workers, PER_TENSOR_MB).step_s)

    def to_dict(self) -> dict[str, list[float]]:
        return {"exchange_fused_step_s": self.fused, "exchange_per_tensor_step_s": self.per_tensor}


def _setup(workers: int, bucket_mb: float) -> Setup:
    return Setup(method="sync-sgd", workers=workers, bucket_mb=bucket_mb, overlap=False)


def fit_exchange_load(
    profile: HardwareProfile, workload: Workload, samples: ExchangeSamples, when: str
) -> ExchangeLoad:
    """The load's two numbers that make the idle profile's predictions of the two runs' medians
    exact (each at least 0: a negative one is set to 0 and the other fitted alone)."""
    if not samples.fused or not samples.per_tensor:
        raise TetherError("no timing of an exchange in training to fit the load to")
    idle = dataclasses.replace(profile, exchange_load=None)

    def loaded(alpha: float, skew: float) -> HardwareProfile:
        load = ExchangeLoad(Sourced(alpha, "probe"), Sourced(skew, "probe"))
        return dataclasses.replace(profile, exchange_load=load)

    rows = []  # (excess over the idle prediction, seconds per unit alpha, per unit skew)
    medians = (statistics.median(samples.fused), statistics.median(samples.per_tensor))
    for bucket_mb, measured in zip((FUSED_MB, PER_TENSOR_MB), medians, strict=True):
        setup = _setup(samples.workers, bucket_mb)
        base = predict(workload, idle, setup).iteration_s
        per_alpha = (predict(workload, loaded(_PROBE, 0.0), setup).iteration_s - base) / _PROBE
        per_skew = (predict(workload, loaded(0.0, _PROBE), setup).iteration_s - base) / _PROBE
        rows.append((measured - base, per_alpha, per_skew))
    (e1, a1, s1), (e2, a2, s2) = rows
    determinant = a1 * s2 - a2 * s1
    alpha = (e1 * s2 - e2 * s1) / determinant if abs(determinant) > 1e-12 else -1.0
    skew = (a1 * e2 - a2 * e1) / determinant if abs(determinant) > 1e-12 else 0.0
    if alpha < 0:  # or the two runs send as many messages: the wait alone
        alpha = 0.0
        skew = max(0.0, statistics.mean([e / s for e, _, s in rows if s > 0] or [0.0]))
    elif skew < 0:
        skew = 0.0
        alpha = max(0.0, sum(e * a for e, a, _ in rows) / sum(a * a for _, a, _ in rows))
    runs = len(samples.fused)
    source = (
        f"{when}: sync-sgd without overlap on {samples.workers} workers, fused "
        f"{medians[0] * 1e3:.2f} ms and a message per tensor {medians[1] * 1e3:.2f} ms per step "
        f"(medians of {runs}), over the idle links' predictions "
        f"{(medians[0] - e1) * 1e3:.2f} and {(medians[1] - e2) * 1e3:.2f} ms"
    )
    return ExchangeLoad(Sourced(alpha, source), Sourced(skew, source))
