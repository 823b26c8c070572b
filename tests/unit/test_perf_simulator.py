"""The discrete-event simulator of the asynchronous and round-robin methods (tether.perf.simulator).

Run this file as a script to time 4096 workers x 1000 rounds of every method."""

from __future__ import annotations

import collections
import heapq
import json
import time
from typing import Any

import numpy as np
import pytest

from tether.perf.simulator import (
    SIMULATED_METHODS,
    SimulationConfig,
    SimulationResult,
    WorkerSpeeds,
    _compute_times,
    closed_form_throughput,
    simulate,
)

EASGD = ("async-easgd", "async-measgd", "hogwild-easgd", "original-easgd")
# c = 1 ms steps. Compute-bound: P s and P (2m + s) are far below a worker's cycle. Server-bound:
# P s (async) and P (2m + s) (round robin) exceed tau c + 2m + s for tau = 4 and for tau = 1.
REGIMES = {
    "compute-bound": dict(workers=8, message_s=1e-5, service_s=1e-5, step=1e-3),
    "server-bound": dict(workers=16, message_s=1e-5, service_s=1e-4, step=1e-4),
}


def config(method: str, regime: str = "compute-bound", **kw: Any) -> SimulationConfig:
    r = REGIMES[regime]
    args: dict[str, Any] = dict(
        method=method,
        workers=r["workers"],
        rounds=400,
        speeds=WorkerSpeeds(r["step"]),
        message_s=r["message_s"],
        service_s=r["service_s"],
        tau=4,
    )
    args.update(kw)
    return SimulationConfig(**args)


JITTERY = WorkerSpeeds(
    1e-3, heterogeneity=0.5, jitter=0.4, straggler_probability=0.05, straggler_slowdown=6
)


@pytest.mark.parametrize("regime", sorted(REGIMES))
@pytest.mark.parametrize("method", SIMULATED_METHODS)
def test_equal_workers_match_the_closed_form(method: str, regime: str) -> None:
    cfg = config(method, regime)
    assert simulate(cfg).throughput_steps_s == pytest.approx(closed_form_throughput(cfg), rel=0.01)


def test_closed_forms_by_hand() -> None:
    c, m, s, p, tau = 1e-3, 1e-5, 1e-4, 16, 4
    speeds = WorkerSpeeds(c)

    def cf(method: str) -> float:
        return closed_form_throughput(
            SimulationConfig(method, p, 10, speeds, message_s=m, service_s=s, tau=tau)
        )

    # an async-sgd worker pushes every tau steps, as in training (tau 1 by default)
    assert cf("async-sgd") == pytest.approx(tau * min(p / (tau * c + 2 * m + s), 1 / s))
    assert cf("async-easgd") == pytest.approx(tau * min(p / (tau * c + 2 * m + s), 1 / s))
    assert cf("hogwild-sgd") == pytest.approx(p / (c + s))
    assert cf("hogwild-easgd") == pytest.approx(p * tau / (tau * c + 2 * m + s))
    assert cf("original-easgd") == pytest.approx(
        p * tau / max(tau * c + 2 * m + s, p * (2 * m + s))
    )


def reference_fcfs(compute: np.ndarray, m: float, s: float) -> tuple[list[int], float, list[float]]:
    """The textbook event loop: a heap of (arrival, sequence number, worker)."""
    p, r = compute.shape
    heap = [(compute[w, 0] + m, w, w) for w in range(p)]
    heapq.heapify(heap)
    seq, free, count = p, 0.0, 0
    last, rnd, stale, finish = [-1] * p, [0] * p, [], [0.0] * p
    while heap:
        t, _, w = heap[0]
        free = max(free, t) + s
        stale.append(count - last[w] - 1)
        last[w], count, rnd[w] = count, count + 1, rnd[w] + 1
        if rnd[w] < r:
            heapq.heapreplace(heap, (free + 2 * m + compute[w, rnd[w]], seq, w))
            seq += 1
        else:
            heapq.heappop(heap)
            finish[w] = free + m
    return stale, free, finish


# dyadic times tie exactly: a worker's new message and another's pending one arrive together
TIES = WorkerSpeeds(0.5, worker_factors=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0))


@pytest.mark.parametrize(
    "speeds,message_s,service_s",
    [
        (JITTERY, 3e-5, 1e-5),
        (JITTERY, 3e-5, 2e-4),
        (WorkerSpeeds(1e-3), 3e-5, 1e-4),
        (WorkerSpeeds(1e-3), 3e-5, 0.0),
        (TIES, 0.125, 0.0625),
        (TIES, 0.0, 0.0),
    ],
)
def test_fcfs_batches_agree_with_a_heap_event_loop(
    speeds: WorkerSpeeds, message_s: float, service_s: float
) -> None:
    cfg = SimulationConfig("async-sgd", 7, 80, speeds, message_s=message_s, service_s=service_s)
    stale, elapsed, finish = reference_fcfs(_compute_times(cfg), message_s, service_s)
    res = simulate(cfg)
    assert res.staleness == dict(collections.Counter(stale))
    assert res.elapsed_s == pytest.approx(elapsed, rel=1e-9)
    assert res.worker_finish_s == pytest.approx(finish, rel=1e-9)


def test_hogwild_sgd_staleness_counts_the_others_writes_during_a_step() -> None:
    cfg = SimulationConfig("hogwild-sgd", 5, 40, JITTERY, service_s=1e-4)
    ends = np.cumsum(_compute_times(cfg) + cfg.service_s, axis=1)
    starts = np.concatenate([np.zeros((5, 1)), ends[:, :-1]], axis=1)
    expected: dict[int, int] = {}
    for w in range(5):
        others = np.delete(ends, w, axis=0).ravel()
        for a, b in zip(starts[w], ends[w], strict=True):
            n = int(((others > a) & (others < b)).sum())
            expected[n] = expected.get(n, 0) + 1
    assert simulate(cfg).staleness == expected


def test_round_robin_agrees_with_a_sequential_loop() -> None:
    cfg = SimulationConfig("original-easgd", 6, 50, JITTERY, message_s=2e-5, service_s=1e-4, tau=3)
    compute, x = _compute_times(cfg), 2 * cfg.message_s + cfg.service_s
    done, free = np.zeros(6), 0.0
    for t in range(50):
        for k in range(6):
            free = done[k] = max(free, done[k] + compute[k, t]) + x
    res = simulate(cfg)
    assert res.elapsed_s == pytest.approx(free, rel=1e-9)
    assert res.worker_finish_s == pytest.approx(list(done), rel=1e-9)


def test_hogwild_sgd_with_one_worker_is_never_stale() -> None:
    res = simulate(SimulationConfig("hogwild-sgd", 1, 50, JITTERY, service_s=1e-4))
    assert res.staleness == {0: 50}
    assert res.mean_staleness == 0.0
    assert res.server_utilisation == 0.0


def test_round_robin_staleness_is_p_minus_1_in_steady_state() -> None:
    p, r = 6, 30
    res = simulate(SimulationConfig("original-easgd", p, r, JITTERY, message_s=1e-5, tau=2))
    # the first round sees only the lower ranks' exchanges since the start
    assert res.staleness == {**{k: 1 for k in range(p - 1)}, p - 1: 1 + (r - 1) * p}


def test_server_bound_async_sgd_staleness_is_near_p_minus_1() -> None:
    cfg = config("async-sgd", "server-bound")
    res = simulate(cfg)
    assert res.mean_staleness == pytest.approx(cfg.workers - 1, rel=0.01)
    assert max(res.staleness) == cfg.workers - 1


def test_one_slow_worker_stalls_round_robin_but_not_async_easgd() -> None:
    p, tau, c, m, s = 8, 4, 1e-3, 1e-5, 1e-5
    x = 2 * m + s

    def rate(method: str, factors: tuple[float, ...] = ()) -> float:
        speeds = WorkerSpeeds(c, worker_factors=factors)
        cfg = SimulationConfig(method, p, 400, speeds, message_s=m, service_s=s, tau=tau)
        return simulate(cfg).throughput_steps_s

    slow = (4.0,) + (1.0,) * (p - 1)
    equal = p * tau / (tau * c + x)
    # round robin: every round waits for rank 0's 4 tau c; async: the others keep their pace and
    # the slow worker contributes a quarter of its share
    round_robin = p * tau / (4 * tau * c + x)
    async_easgd = (p - 1) * tau / (tau * c + x) + tau / (4 * tau * c + x)
    assert rate("original-easgd") == pytest.approx(equal, rel=0.01)
    assert rate("original-easgd", slow) == pytest.approx(round_robin, rel=0.03)
    assert rate("async-easgd", slow) == pytest.approx(async_easgd, rel=0.03)
    assert rate("original-easgd", slow) < 0.3 * equal and rate("async-easgd", slow) > 0.85 * equal


@pytest.mark.parametrize("method", SIMULATED_METHODS)
def test_stragglers_lengthen_the_run(method: str) -> None:
    base = config(method, rounds=100)
    slowed = config(
        method,
        rounds=100,
        speeds=WorkerSpeeds(1e-3, straggler_probability=0.1, straggler_slowdown=5),
    )
    assert simulate(slowed).elapsed_s > 1.2 * simulate(base).elapsed_s


@pytest.mark.parametrize("method", SIMULATED_METHODS)
def test_the_seed_fixes_the_result(method: str) -> None:
    cfg = config(method, rounds=50, speeds=JITTERY, seed=3)
    assert simulate(cfg) == simulate(cfg)
    other = simulate(config(method, rounds=50, speeds=JITTERY, seed=4))
    assert other.elapsed_s != simulate(cfg).elapsed_s


def test_utilisation() -> None:
    assert simulate(config("async-sgd", "server-bound")).server_utilisation > 0.99
    assert simulate(config("async-sgd", "compute-bound")).server_utilisation < 0.2
    assert simulate(config("original-easgd", "server-bound")).server_utilisation > 0.99
    hogwild = simulate(config("hogwild-easgd", "server-bound"))
    assert 0 < hogwild.server_utilisation <= 1


def test_counts_and_json() -> None:
    res = simulate(config("async-easgd", rounds=20, speeds=JITTERY))
    assert (res.updates, res.steps) == (8 * 20, 8 * 20 * 4)
    assert sum(res.staleness.values()) == res.updates
    assert len(res.worker_finish_s) == 8 and max(res.worker_finish_s) > res.elapsed_s
    # an async-sgd worker pushes every tau steps as in training; hogwild-sgd has no period
    assert simulate(config("async-sgd", rounds=20)).steps == 8 * 20 * 4
    assert simulate(config("hogwild-sgd", rounds=20)).steps == 8 * 20
    d = json.loads(json.dumps(res.to_dict()))
    assert d == res.to_dict() and d["method"] == "async-easgd"
    assert isinstance(res, SimulationResult)


@pytest.mark.parametrize(
    "make,field",
    [
        (lambda: config("sync-sgd"), "method"),
        (lambda: config("async-sgd", workers=0), "workers"),
        (lambda: config("async-sgd", rounds=0), "rounds"),
        (lambda: config("async-easgd", tau=0), "tau"),
        (lambda: config("async-sgd", message_s=-1e-3), "message_s"),
        (lambda: config("async-sgd", service_s=float("nan")), "service_s"),
        (lambda: WorkerSpeeds(0.0), "step_s"),
        (lambda: WorkerSpeeds(-1.0), "step_s"),
        (lambda: WorkerSpeeds(1.0, heterogeneity=-0.1), "heterogeneity"),
        (lambda: WorkerSpeeds(1.0, jitter=-0.1), "jitter"),
        (lambda: WorkerSpeeds(1.0, straggler_probability=1.5), "straggler_probability"),
        (lambda: WorkerSpeeds(1.0, straggler_probability=-0.1), "straggler_probability"),
        (lambda: WorkerSpeeds(1.0, straggler_slowdown=0.5), "straggler_slowdown"),
        (lambda: WorkerSpeeds(1.0, worker_factors=(1.0, 0.0)), "worker_factors"),
        (
            lambda: config("async-sgd", speeds=WorkerSpeeds(1.0, worker_factors=(1.0, 2.0))),
            "worker_factors",
        ),
    ],
)
def test_invalid_input_names_the_field(make: Any, field: str) -> None:
    with pytest.raises(ValueError, match=field) as err:
        make()
    assert "\n" not in str(err.value)


def test_unknown_method_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError) as err:
        config("sync-sgd")
    assert all(name in str(err.value) for name in SIMULATED_METHODS)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"rounds": 2.5}, "rounds must be a whole number, got 2.5"),  # it ran 2 rounds
        ({"workers": "4"}, "workers must be a whole number, got '4'"),
        ({"tau": 1.5}, "tau must be a whole number, got 1.5"),
        ({"rounds": 0}, "rounds must be at least 1, got 0"),
    ],
)
def test_the_python_api_refuses_counts_that_are_not_whole_numbers(
    arguments: dict[str, Any], message: str
) -> None:
    from tether.api.perf import simulate as api_simulate
    from tether.errors import TetherError

    given = {"method": "async-easgd", "workers": 2, "rounds": 3, "step_s": 0.01, **arguments}
    with pytest.raises(TetherError, match=message):
        api_simulate(**given)


if __name__ == "__main__":
    speeds = {
        "equal": WorkerSpeeds(1e-2),
        "mixed": WorkerSpeeds(
            1e-2, heterogeneity=0.3, jitter=0.3, straggler_probability=0.01, straggler_slowdown=5
        ),
    }
    for name, sp in speeds.items():
        for method in SIMULATED_METHODS:
            cfg = SimulationConfig(method, 4096, 1000, sp, message_s=1e-4, service_s=5e-6, tau=4)
            start = time.perf_counter()
            res = simulate(cfg)
            print(
                f"{name:6s} {method:15s} {time.perf_counter() - start:6.2f} s  "
                f"{res.throughput_steps_s:10.0f} steps/s  util {res.server_utilisation:.3f}  "
                f"staleness {res.mean_staleness:7.1f}"
            )
