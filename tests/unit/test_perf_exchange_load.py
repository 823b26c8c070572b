"""The exchange under load (tether.perf.exchange_load, tether.bench.exchange_load): its price by
hand, where it applies, and its fit from two timed runs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tether.bench.compute_samples import LoopTimes
from tether.bench.exchange_load import ExchangeSamples, fit_exchange_load
from tether.errors import TetherError
from tether.perf.exchange_load import expected_latest
from tether.perf.predict import Setup, predict
from tether.perf.profile import ExchangeLoad, profile_from_dict
from tether.perf.workload import LayerCost, Workload

A, B, G = 1e-4, 1e-9, 1e-10
ALPHA_LOAD, SKEW, SERVER = 3e-4, 1.5e-3, 2e-3


def _profile(cores: int = 0, load: bool = True) -> dict:
    def s(v: float) -> dict:
        return {"value": v, "source": "test"}

    data = {
        "name": "test",
        "description": "hand-made",
        "ranks_per_node": 64,
        "cores_per_node": cores,
        "intra": {"alpha": s(A), "beta": s(B)},
        "inter": {"alpha": s(A), "beta": s(B)},
        "gamma": s(G),
        "flops": s(1e9),
    }
    if load:
        data["exchange_load"] = {"alpha": s(ALPHA_LOAD), "skew": s(SKEW), "server": s(SERVER)}
    return data


LOADED, IDLE = profile_from_dict(_profile()), profile_from_dict(_profile(load=False))
TENSORS = (400_000, 400, 4_000_000, 4_000)
WORKLOAD = Workload(
    model="toy",
    batch_size=32,
    layers=(
        LayerCost("a", TENSORS[:2], 1e6, forward_s=0.002, backward_s=0.004),
        LayerCost("b", TENSORS[2:], 2e6, forward_s=0.001, backward_s=0.002),
    ),
    update_s=0.0005,
    measured_on="test",
)


def _iteration(profile, method: str, workers: int, **options) -> float:
    setup = Setup(method, workers, **options)
    return predict(WORKLOAD, profile, setup).iteration_s


def test_expected_latest_of_normals() -> None:
    # Blom's approximation against the exact E[max] of 2 and 4 standard normals
    assert expected_latest(1) == 0.0
    assert expected_latest(2) == pytest.approx(1 / math.sqrt(math.pi), rel=0.05)
    assert expected_latest(4) == pytest.approx(1.0294, rel=0.03)
    growing = [expected_latest(p) for p in (2, 4, 64, 4096)]
    assert growing == sorted(growing) and growing[-1] < 4  # grows like sqrt(2 ln P), not P


def test_the_load_prices_every_message_and_each_exchange_by_hand() -> None:
    for workers in (2, 4):
        scale = expected_latest(workers) / expected_latest(2)
        per_tensor = _iteration(LOADED, "sync-sgd", workers, bucket_mb=0, overlap=False)
        idle = _iteration(IDLE, "sync-sgd", workers, bucket_mb=0, overlap=False)
        messages = len(TENSORS) * 2 * (workers - 1)  # the ring's 2(P-1) steps per tensor
        assert per_tensor - idle == pytest.approx(messages * ALPHA_LOAD + SKEW * scale)
    # local-sgd: one all-reduce of the model and one wait every tau steps
    local = _iteration(LOADED, "local-sgd", 2, tau=4) - _iteration(IDLE, "local-sgd", 2, tau=4)
    assert local == pytest.approx((2 * ALPHA_LOAD + SKEW) / 4)
    # the wait is never hidden: overlapped sync-easgd still pays it
    easgd = _iteration(LOADED, "sync-easgd", 2, tau=4) - _iteration(IDLE, "sync-easgd", 2, tau=4)
    assert easgd == pytest.approx(SKEW / 4)


def test_shared_cores_stretch_the_wait() -> None:
    shared = profile_from_dict(_profile(cores=2))
    idle = profile_from_dict(_profile(cores=2, load=False))
    extra = _iteration(shared, "sync-sgd", 4, bucket_mb=0, overlap=False)
    extra -= _iteration(idle, "sync-sgd", 4, bucket_mb=0, overlap=False)
    scale = expected_latest(4) / expected_latest(2)
    assert extra == pytest.approx(len(TENSORS) * 6 * ALPHA_LOAD + SKEW * scale * 2)  # 4 on 2
    assert _iteration(LOADED, "sync-sgd", 1) == _iteration(IDLE, "sync-sgd", 1)


def test_the_server_spends_its_load_on_every_exchange() -> None:
    def server(profile, method: str) -> float:
        return predict(WORKLOAD, profile, Setup(method, 16)).details["server_service_s"]

    # async-sgd's apply is two passes over the model, original-easgd's elastic move three; each
    # also pays the link's start-up and, in training, the measured load
    n = sum(TENSORS)
    assert server(LOADED, "async-sgd") == pytest.approx(2 * n * G + A + SERVER)
    assert server(LOADED, "original-easgd") == pytest.approx(3 * n * G + A + SERVER)
    assert server(IDLE, "async-sgd") == pytest.approx(2 * n * G + A)
    # 16 workers keep the server busy: its service bounds the rate (P * s per local step)
    assert _iteration(LOADED, "async-sgd", 16) == pytest.approx(16 * (2 * n * G + A + SERVER))
    # Hogwild's shared-memory server has no messages: no load
    assert _iteration(LOADED, "hogwild-sgd", 4) == _iteration(IDLE, "hogwild-sgd", 4)


class _Runs:
    """Stand-in exchange runs whose step times are what ``truth`` predicts, plus ``noise``."""

    def __init__(self, truth, noise: float = 0.0) -> None:
        self.truth, self.noise = truth, noise

    def exchanging(self, workers: int, bucket_mb: float) -> LoopTimes:
        setup = Setup("sync-sgd", workers, bucket_mb=bucket_mb, overlap=False)
        step = predict(WORKLOAD, self.truth, setup).iteration_s + self.noise
        return LoopTimes(step, step)

    def one_worker(self) -> LoopTimes:
        raise AssertionError("not used")

    def quiet(self, workers: int) -> LoopTimes:
        raise AssertionError("not used")

    def serving(self, workers: int) -> LoopTimes:
        step = predict(WORKLOAD, self.truth, Setup("async-sgd", workers)).iteration_s + self.noise
        return LoopTimes(step, step)


def _fitted(truth, workers: int = 2, noise: float = 0.0) -> ExchangeLoad:
    samples = ExchangeSamples(_Runs(truth, noise), workers)
    for _ in range(3):
        samples.take()
    return fit_exchange_load(IDLE, WORKLOAD, samples, "now")


def test_the_fit_recovers_the_load_from_the_two_runs() -> None:
    for workers in (2, 3):
        fit = _fitted(LOADED, workers)
        assert fit.alpha.value == pytest.approx(ALPHA_LOAD)
        assert fit.skew.value == pytest.approx(SKEW)
        assert fit.server.value == pytest.approx(SERVER)
        assert f"on {workers} workers" in fit.skew.source
        assert f"async-sgd on {workers} workers" in fit.server.source
    # idle runs: no load; runs faster than the idle prediction: none either, never negative
    assert _fitted(IDLE).alpha.value == pytest.approx(0.0, abs=1e-12)
    faster = _fitted(IDLE, noise=-1e-3)
    assert faster.alpha.value == 0.0 and faster.skew.value == 0.0 and faster.server.value == 0.0
    # the same excess on both runs is a wait, not a per-message cost
    waiting = _fitted(IDLE, noise=2e-3)
    assert waiting.alpha.value == pytest.approx(0.0, abs=1e-12)
    assert waiting.skew.value == pytest.approx(2e-3)


def test_the_profile_keeps_the_load_and_checks_it() -> None:
    assert profile_from_dict(LOADED.to_dict()) == LOADED
    assert IDLE.exchange_load is None and "exchange_load" not in IDLE.to_dict()
    broken = _profile()
    del broken["exchange_load"]["skew"]
    with pytest.raises(TetherError, match=r"missing field 'exchange_load\.skew'"):
        profile_from_dict(broken)
    with pytest.raises(TetherError, match="no timing of an exchange"):
        fit_exchange_load(IDLE, WORKLOAD, ExchangeSamples(_Runs(IDLE), 2), "now")
    negative = _profile()
    negative["exchange_load"]["alpha"] = {"value": -1.0, "source": "t"}
    with pytest.raises(TetherError, match="must be >= 0"):
        profile_from_dict(negative)
    assert dataclasses.replace(LOADED, exchange_load=None) == IDLE
