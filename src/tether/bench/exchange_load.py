"""The exchange under load for ``tether calibrate``: what an exchange costs in training beyond
the idle links' price (:mod:`tether.perf.exchange_load` says what the three numbers mean).

Two short sync-sgd runs without overlap on the calibration's workers, one fused (few messages
per step) and one with a message per tensor (many), and one async-sgd run are timed in each
round of the calibration. The sync runs' medians' excess over what the idle profile predicts for
each is linear in the collective's two unknowns (per message, per exchange), so two runs that
differ in their message count separate them; without overlap the prediction is a plain sum, so
the coefficients are exact. The server's CPU per exchange is then the value that makes the
prediction of the async-sgd run its median (found by bisection: the prediction grows with it).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
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
    """Step times of the three runs, one of each per round of the calibration."""

    loops: LoopTimer
    workers: int
    fused: list[float] = field(default_factory=list)
    per_tensor: list[float] = field(default_factory=list)
    served: list[float] = field(default_factory=list)

    def take(self) -> None:
        self.fused.append(self.loops.exchanging(self.workers, FUSED_MB).step_s)
        self.per_tensor.append(self.loops.exchanging(self.workers, PER_TENSOR_MB).step_s)
        self.served.append(self.loops.serving(self.workers).step_s)

    def to_dict(self) -> dict[str, list[float]]:
        return {
            "exchange_fused_step_s": self.fused,
            "exchange_per_tensor_step_s": self.per_tensor,
            "exchange_served_step_s": self.served,
        }


def _setup(workers: int, bucket_mb: float) -> Setup:
    return Setup(method="sync-sgd", workers=workers, bucket_mb=bucket_mb, overlap=False)


def fit_exchange_load(
    profile: HardwareProfile, workload: Workload, samples: ExchangeSamples, when: str
) -> ExchangeLoad:
    """The load's three numbers that make the idle profile's predictions of the three runs'
    medians exact (each at least 0: of the collective's two, a negative one is set to 0 and the
    other fitted alone; a server run faster than the idle prediction gets 0)."""
    if not samples.fused or not samples.per_tensor or not samples.served:
        raise TetherError("no timing of an exchange in training to fit the load to")
    idle = dataclasses.replace(profile, exchange_load=None)

    def loaded(alpha: float, skew: float, server: float = 0.0) -> HardwareProfile:
        load = ExchangeLoad(
            Sourced(alpha, "probe"), Sourced(skew, "probe"), Sourced(server, "probe")
        )
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
    served = statistics.median(samples.served)
    serving = Setup(method="async-sgd", workers=samples.workers)

    def predicted(server: float) -> float:
        return predict(workload, loaded(alpha, skew, server), serving).iteration_s

    server = _solve_increasing(predicted, served)
    server_source = (
        f"{when}: async-sgd on {samples.workers} workers, {served * 1e3:.2f} ms per step "
        f"(median of {len(samples.served)}), over the idle profile's {predicted(0.0) * 1e3:.2f} ms"
    )
    return ExchangeLoad(
        Sourced(alpha, source), Sourced(skew, source), Sourced(server, server_source)
    )


def _solve_increasing(f: Callable[[float], float], target: float) -> float:
    """The ``x >= 0`` where the non-decreasing ``f`` reaches ``target`` (0 when ``f(0)`` is
    already past it), by bisection; the bracket doubles from ``target`` seconds until it holds
    the answer (``f`` grows at least as fast as its argument here: the server's every exchange
    pays it)."""
    if f(0.0) >= target:
        return 0.0
    high = max(target, 1e-6)
    while f(high) < target:
        high *= 2
    low = 0.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if f(middle) < target else (low, middle)
    return (low + high) / 2
