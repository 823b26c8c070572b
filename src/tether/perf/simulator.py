"""Discrete-event simulation of the asynchronous and round-robin methods: throughput, staleness and
server utilisation with heterogeneous workers and stragglers.

The methods are those compared by You, Buluc and Demmel, "Scaling deep learning on GPU and Knights
Landing clusters" (SC17): asynchronous SGD with a parameter server (Dean et al., "Large scale
distributed deep networks", NIPS 2012, Downpour), the Elastic Averaging SGD family (Zhang,
Choromanska and LeCun, "Deep learning with elastic averaging SGD", NIPS 2015: ``tau`` local steps
between exchanges with the center), its round-robin original form, and lock-free Hogwild (Recht,
Re, Wright and Niu, "Hogwild!", NIPS 2011). Momentum variants (``async-msgd``, ``async-measgd``)
have the same timing as their plain forms.

Times: ``c`` one local step, ``m`` one one-way message, ``s`` the server's work per update or
exchange, ``x = 2m + s`` one exchange seen from a worker. Per method:

* ``async-*``: the worker computes ``tau`` steps (async-sgd and async-msgd push the gradients
  averaged over them; 1 by default), sends (m), the server applies
  updates first-come-first-served one at a time (s each), and replies (m); the next computation
  starts on the reply. Staleness: updates by others between this worker's two consecutive ones.
* ``hogwild-easgd``: as ``async-easgd`` but the server applies exchanges concurrently (no lock, no
  queue); ``hogwild-sgd``: shared memory (no messages: ``m`` is unused), a step costs ``c + s``
  (the in-place write), and its staleness is the writes by others between its read (its start)
  and its write. Simultaneous updates of independent workers are ordered by rank.
* ``original-easgd``: the master serves ranks 0, 1, ..., P-1, 0, ... with a blocking send/recv per
  rank, so an exchange starts when the master has finished the previous rank's exchange and this
  worker has finished its ``tau`` steps, and holds the master for all of ``2m + s`` (the master
  waits on that rank's message; nothing is queued ahead). Staleness is P-1 in steady state.

An update's time is when the server (or memory) has applied it; ``elapsed_s`` is the last one's.
Every worker does exactly ``rounds`` interactions, so a slow worker runs on alone at the end; the
throughputs are therefore rates over the window in which all workers are still working (to the
first worker's last update), which is what a training run that stops on a step budget sees.

Closed forms (steady state, equal deterministic workers, ``T = tau c``)::

    async-*         P tau / max(T + x, P s)        the server bounds updates at 1/s
    hogwild-easgd   P tau / (T + x)
    hogwild-sgd     P / (c + s)
    original-easgd  P tau / max(T + x, P x)        one round of P exchanges of x each
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tether.perf.checks import is_finite_number
from tether.perf.run_setup import EVERY_STEP_METHODS

_FCFS = ("async-sgd", "async-msgd", "async-easgd", "async-measgd")
SIMULATED_METHODS: tuple[str, ...] = (*_FCFS, "hogwild-sgd", "hogwild-easgd", "original-easgd")
_ONE_STEP = tuple(m for m in EVERY_STEP_METHODS if m in SIMULATED_METHODS)
_DRAW_BLOCK = 1 << 22  # random numbers per block: bounded memory with tau local steps per round


def _check(ok: bool, what: str, fix: str) -> None:
    if not ok:
        raise ValueError(f"{what}; {fix}")


def _at_least(name: str, value: float, low: float, fix: str, above: bool = False) -> None:
    # a string or None is refused in one line too, not with math's TypeError
    _check(is_finite_number(value), f"{name} = {value!r} is not a finite number", fix)
    ok = value > low if above else value >= low
    _check(ok, f"{name} = {value!r} must be {'>' if above else '>='} {low}", fix)


@dataclass(frozen=True)
class WorkerSpeeds:
    """How long local steps take. A worker's step is ``step_s`` times its speed factor (lognormal
    with sigma ``heterogeneity``, normalised to mean 1, times ``worker_factors[k]`` where given)
    times a per-step lognormal jitter (mean 1) times ``straggler_slowdown`` with probability
    ``straggler_probability``. ``worker_factors`` (one per worker, or empty) pins slow ranks."""

    step_s: float
    heterogeneity: float = 0.0
    jitter: float = 0.0
    straggler_probability: float = 0.0
    straggler_slowdown: float = 1.0
    worker_factors: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        _at_least("step_s", self.step_s, 0, "give the mean step time in seconds", above=True)
        _at_least("heterogeneity", self.heterogeneity, 0, "give a lognormal sigma")
        _at_least("jitter", self.jitter, 0, "give a lognormal sigma")
        p = self.straggler_probability
        _check(
            is_finite_number(p) and 0 <= p <= 1,
            f"straggler_probability = {p!r} is outside [0, 1]",
            "use a probability",
        )
        _at_least("straggler_slowdown", self.straggler_slowdown, 1, "it multiplies a step's time")
        _check(
            all(is_finite_number(f) and f > 0 for f in self.worker_factors),
            "worker_factors must all be > 0",
            "give positive per-worker step-time multipliers",
        )

    @property
    def mean_step_s(self) -> float:
        """Expected step time of a worker with factor 1 (stragglers included)."""
        return self.step_s * (1 + self.straggler_probability * (self.straggler_slowdown - 1))


@dataclass(frozen=True)
class SimulationConfig:
    """One simulation: ``rounds`` server interactions per worker. ``tau`` is the local steps per
    exchange (async-sgd's and async-msgd's gradients averaged over them); hogwild-sgd does one
    step per update and ignores it."""

    method: str
    workers: int
    rounds: int
    speeds: WorkerSpeeds
    message_s: float = 0.0
    service_s: float = 0.0
    tau: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        _check(
            self.method in SIMULATED_METHODS,
            f"method {self.method!r} is not simulated",
            f"use one of {', '.join(SIMULATED_METHODS)}",
        )
        _at_least("workers", self.workers, 1, "simulate at least one worker")
        _at_least("rounds", self.rounds, 1, "simulate at least one update per worker")
        _at_least("tau", self.tau, 1, "do at least one local step per exchange")
        _at_least("message_s", self.message_s, 0, "give a message's time in seconds")
        _at_least("service_s", self.service_s, 0, "give the server's time per update in seconds")
        n = len(self.speeds.worker_factors)
        _check(
            n in (0, self.workers),
            f"worker_factors has {n} entries for {self.workers} workers",
            "give one factor per worker or none",
        )

    @property
    def steps_per_update(self) -> int:
        return 1 if self.method in _ONE_STEP else self.tau


@dataclass(frozen=True)
class SimulationResult:
    """What a simulation measured. Rates and utilisation are over the window in which every
    worker is still working (see the module's docstring); ``steps / elapsed_s`` is the makespan
    rate. Every worker does ``rounds`` interactions, so instead of per-worker step counts (all
    equal) the result gives ``worker_finish_s``: when each worker received its last reply."""

    method: str
    workers: int
    elapsed_s: float  # simulated time of the last update
    updates: int  # server updates or exchanges (shared-memory writes for hogwild-sgd)
    steps: int  # local steps of all workers
    throughput_steps_s: float
    updates_per_s: float
    server_utilisation: float  # busy fraction of the server in the window; 0 without one
    staleness: dict[int, int]  # staleness -> number of updates
    mean_staleness: float
    worker_finish_s: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (staleness keys as strings, as JSON would make them)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["staleness"] = {str(k): v for k, v in self.staleness.items()}
        out["worker_finish_s"] = list(self.worker_finish_s)
        return out


def _lognormal(rng: np.random.Generator, sigma: float, shape: Any) -> np.ndarray:
    return np.exp(rng.normal(-0.5 * sigma * sigma, sigma, shape))  # mean exactly 1


def _compute_times(config: SimulationConfig) -> np.ndarray:
    """(workers, rounds): seconds of local computing before each interaction."""
    sp, p, r, tau = config.speeds, config.workers, config.rounds, config.steps_per_update
    rng = np.random.default_rng(config.seed)
    factor = np.asarray(sp.worker_factors or np.ones(p), dtype=float) * sp.step_s
    if sp.heterogeneity > 0:
        factor = factor * _lognormal(rng, sp.heterogeneity, p)
    stragglers = sp.straggler_probability > 0 and sp.straggler_slowdown > 1
    if sp.jitter == 0 and not stragglers:
        return np.repeat((factor * tau)[:, None], r, axis=1)
    out = np.empty((p, r))
    block = max(1, _DRAW_BLOCK // (p * tau))
    for r0 in range(0, r, block):
        shape = (p, min(r, r0 + block) - r0, tau)
        steps = _lognormal(rng, sp.jitter, shape) if sp.jitter > 0 else np.ones(shape)
        if stragglers:
            steps *= np.where(
                rng.random(shape) < sp.straggler_probability, sp.straggler_slowdown, 1
            )
        out[:, r0 : r0 + shape[1]] = steps.sum(axis=2)
    return out * factor[:, None]


def _fcfs(compute: np.ndarray, m: float, s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A single FIFO server fed by a closed loop of workers, served in (arrival time, send order)
    order as a heap of (time, sequence number) would. The pending arrivals are kept sorted; a batch
    of the earliest is served at once by the max-plus scan D_k = max(D_{k-1}, A_k) + s, and ends
    before the first arrival that the next message of a worker served earlier in the batch would
    overtake, so the result is exact. Returns update times (in service order), staleness per
    update and each worker's last update time."""
    p, r = compute.shape
    total = p * r
    times, stale = np.empty(total), np.empty(total, dtype=np.int64)
    pend_w = np.argsort(compute[:, 0], kind="stable")  # first messages: sent in rank order
    pend_t = compute[pend_w, 0] + m
    rnd = np.zeros(p, dtype=np.int64)
    last = np.full(p, -1, dtype=np.int64)
    last_time = np.empty(p)
    ranks = np.arange(p)
    free, done, width = 0.0, 0, 64
    while done < total:
        width = min(pend_t.size, max(64, 2 * width))
        a, idx = pend_t[:width], pend_w[:width]
        j = ranks[:width]
        dep = np.maximum(np.maximum.accumulate(a - j * s), free) + (j + 1) * s
        nxt_round = rnd[idx] + 1
        more = nxt_round < r
        nxt = np.full(width, np.inf)
        nxt[more] = dep[more] + 2 * m + compute[idx[more], nxt_round[more]]
        # a tie goes to the pending message: it was sent first
        clash = np.flatnonzero(a[1:] > np.minimum.accumulate(nxt)[:-1])
        k = width = int(clash[0]) + 1 if clash.size else width
        idx, dep, more = idx[:k], dep[:k], more[:k]
        g = np.arange(done, done + k)
        stale[done : done + k] = g - last[idx] - 1
        times[done : done + k] = dep
        last[idx] = g
        rnd[idx] += 1
        last_time[idx[~more]] = dep[~more]
        new_t, new_w = nxt[:k][more], idx[more]
        o = np.argsort(new_t, kind="stable")
        new_t, new_w = new_t[o], new_w[o]
        pos = np.searchsorted(pend_t[k:], new_t, side="right")
        pend_t, pend_w = np.insert(pend_t[k:], pos, new_t), np.insert(pend_w[k:], pos, new_w)
        free, done = float(dep[-1]), done + k
    return times, stale, last_time


def _independent(compute: np.ndarray, per_update: float, offset: float) -> tuple[np.ndarray, ...]:
    """Workers that never wait for each other (Hogwild): update times are cumulative sums, and
    the staleness is read off each update's rank in the global order (ties by rank)."""
    p, r = compute.shape
    at = np.cumsum(compute + per_update, axis=1) - offset
    order = np.argsort(at, axis=None, kind="stable")  # rows are sorted runs: timsort merges them
    rank = np.empty(p * r, dtype=np.int64)
    rank[order] = np.arange(p * r)
    stale = np.diff(rank.reshape(p, r), axis=1, prepend=-1) - 1
    return at.ravel()[order], stale.ravel(), at[:, -1]


def _round_robin(compute: np.ndarray, x: float) -> tuple[np.ndarray, ...]:
    """Strict rank order: within a round E_k = max(E_{k-1}, ready_k) + x, one vectorised scan."""
    p, r = compute.shape
    j = np.arange(p)
    ends = np.empty((r, p))
    done_at, free = np.zeros(p), 0.0
    for t in range(r):
        ready = done_at + compute[:, t]
        done_at = np.maximum(np.maximum.accumulate(ready - j * x), free) + (j + 1) * x
        free = float(done_at[-1])
        ends[t] = done_at
    stale = np.full(p * r, p - 1, dtype=np.int64)
    stale[:p] = j  # the first round: the lower ranks' exchanges since the start
    return ends.ravel(), stale, done_at


def simulate(config: SimulationConfig) -> SimulationResult:
    """Simulate ``config.rounds`` interactions of every worker; see the module's docstring."""
    compute = _compute_times(config)
    m, s, method = config.message_s, config.service_s, config.method
    busy: float | np.ndarray  # the server's busy seconds per update, in update order
    if method in _FCFS:
        times, stale, last = _fcfs(compute, m, s)
        busy, reply = s, m
    elif method == "hogwild-easgd":
        times, stale, last = _independent(compute, 2 * m + s, m)
        # busy while it applies at least one exchange: the union of the [t - s, t]
        busy, reply = np.minimum(np.diff(times, prepend=-np.inf), s), m
    elif method == "hogwild-sgd":
        times, stale, last = _independent(compute, s, 0.0)
        busy, reply = 0.0, 0.0
    else:
        times, stale, last = _round_robin(compute, 2 * m + s)
        busy, reply = 2 * m + s, 0.0
    elapsed = float(times[-1])
    window = float(last.min())
    in_window = int(np.searchsorted(times, window, side="right"))
    busy_s = float(np.broadcast_to(busy, times.shape)[:in_window].sum())
    hist = np.bincount(stale)
    tau = config.steps_per_update
    return SimulationResult(
        method=method,
        workers=config.workers,
        elapsed_s=elapsed,
        updates=int(times.size),
        steps=int(times.size) * tau,
        throughput_steps_s=in_window * tau / window,
        updates_per_s=in_window / window,
        server_utilisation=min(1.0, busy_s / window),
        staleness={int(k): int(n) for k, n in enumerate(hist) if n},
        mean_staleness=float(stale.mean()),
        worker_finish_s=tuple(float(t) for t in last + reply),
    )


def closed_form_throughput(config: SimulationConfig) -> float:
    """Steady-state local steps per second from the module docstring's closed forms: exact for
    equal deterministic workers; otherwise a mean-value estimate (mean step time, stragglers
    included) that ignores queueing variance and the slowest worker."""
    p, tau = config.workers, config.steps_per_update
    c = config.speeds.mean_step_s
    if config.speeds.worker_factors:
        c *= float(np.mean(config.speeds.worker_factors))
    s, x = config.service_s, 2 * config.message_s + config.service_s
    if config.method in _FCFS:
        return p * tau / max(tau * c + x, p * s)
    if config.method == "hogwild-easgd":
        return p * tau / (tau * c + x)
    if config.method == "hogwild-sgd":
        return p / (c + s)
    return p * tau / max(tau * c + x, p * x)
