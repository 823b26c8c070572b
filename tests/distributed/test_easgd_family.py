"""The EASGD family and the async baselines against single-process references of their math.

References are a few lines of tensor math written from the EASGD papers (Zhang et al. 2015; You et al. 2017), run in the test
process. Deterministic methods (sync-easgd, local-sgd, original-easgd) are compared directly; for
the first-come-first-served methods the workers pass a token so that the arrival order is known
(1, 2, 1, 2, ...), and the exact center / weights are checked. Tolerance: 1e-6 relative (float32,
the same operations in the same order up to the association of 2-term sums).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.method_drive import RecordingHooks, cross_entropy_step, loss_and_gradient
from tether.comm.header import MessageKind
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data import GlobalBatchSampler
from tether.errors import TetherError
from tether.launch.spawn import SpawnedError, run_spawned
from tether.methods import METHODS, MethodContext
from tether.methods.flat import flatten_parameters
from tether.methods.ps_server import TOTALS_WORDS
from tether.models import build_model
from tether.observe.metrics import PhaseTotals

STEPS, BATCH, LR, MU, TAU = 4, 4, 0.1, 0.9, 2
TOKEN_TAG = 99
REL_TOL = 1e-6


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(64, 1, 8, 8, generator=gen), torch.randint(0, 10, (64,), generator=gen)


def _model(name: str = "mlp"):
    torch.manual_seed(0)
    return build_model(name, (1, 8, 8), 10)


def _config(**change) -> TrainConfig:
    return TrainConfig(lr=LR, momentum=MU, tau=TAU, weight_decay=0.0, **change)


def _batch(step: int, index: int, workers: int):
    x, y = _data()
    idx = GlobalBatchSampler(len(x), BATCH * workers, seed=1).worker_indices(step, index, workers)
    return x[idx], y[idx]


def _run(
    rank: int, world: int, method: str, token: bool, slow_first: float = 0.0, **change
) -> dict:
    """Drive one method by hand on this rank. With ``token`` the workers exchange in turn
    (1, 2, ..., P, 1, ...); ``slow_first`` delays worker 1 before each exchange."""
    cls = METHODS.get(method)
    m = cls(_model(), MethodContext(_config(**change), TorchTransport(), torch.device("cpu")))
    m.start()
    servers = cls.server_processes
    if servers and rank == 0:
        result = m.serve(RecordingHooks())
        dist.barrier()  # the next method's handshake must not reach this method's server
        return {"weights": m.flat.clone(), "arrivals": m.server.state.arrivals, **result.extra}
    index, workers = rank - servers, world - servers
    first, last = servers, world - 1
    exchanges = STEPS // TAU
    for step in range(STEPS):
        k = (step + 1) // TAU - 1  # the number of this step's exchange, if it has one
        exchanging = (step + 1) % TAU == 0
        if exchanging and token and index > 0:
            dist.recv(torch.zeros(1), src=rank - 1, tag=TOKEN_TAG)
        if exchanging and token and index == 0 and k > 0 and workers > 1:
            dist.recv(torch.zeros(1), src=last, tag=TOKEN_TAG)
        if exchanging and index == 0:
            time.sleep(slow_first)
        cross_entropy_step(m, *_batch(step, index, workers))
        if exchanging and token and index < workers - 1:
            dist.send(torch.zeros(1), dst=rank + 1, tag=TOKEN_TAG)
        if exchanging and token and index == workers - 1 and k < exchanges - 1 and workers > 1:
            dist.send(torch.zeros(1), dst=first, tag=TOKEN_TAG)
    m.finish(PhaseTotals())
    dist.barrier()
    out = {"weights": m.flat.clone()}
    if hasattr(m, "center"):
        out["center"] = m.center.clone()
    return out


# -- references: the EASGD papers (Zhang et al. 2015; You et al. 2017), one process -------------------------------------------
class _Replica:
    """A flat parameter vector with its model, for computing gradients at given weights."""

    def __init__(self) -> None:
        self.model = _model()
        self.x = flatten_parameters(self.model)

    def grad(self, step: int, index: int, workers: int) -> torch.Tensor:
        return loss_and_gradient(self.model, *_batch(step, index, workers))[1]


def _alpha(workers: int) -> float:
    return 0.9 / workers


def reference_elastic(workers: int, momentum: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """EASGD with exchanges in the order 1..P per round (round-robin, or FCFS with tokens)."""
    alpha = _alpha(workers)
    reps = [_Replica() for _ in range(workers)]
    center = reps[0].x.clone()
    velocity = [torch.zeros_like(center) for _ in reps]
    for step in range(STEPS):
        for i, rep in enumerate(reps):  # local steps (the order between workers is irrelevant)
            if momentum:  # v <- mu*v - lr*g(x + mu*v); x <- x + v
                rep.x.add_(velocity[i], alpha=MU)
                g = rep.grad(step, i, workers)
                rep.x.sub_(velocity[i], alpha=MU)
                velocity[i].mul_(MU).sub_(g, alpha=LR)
                rep.x.add_(velocity[i])
            else:
                rep.x.sub_(rep.grad(step, i, workers), alpha=LR)
        if (step + 1) % TAU == 0:
            for rep in reps:  # exchanges, one at a time, each with the current center
                d = rep.x - center
                rep.x.sub_(d, alpha=alpha)
                center.add_(d, alpha=alpha)
    return center, [rep.x for rep in reps]


def reference_sync_easgd(workers: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    alpha = _alpha(workers)
    reps = [_Replica() for _ in range(workers)]
    center = reps[0].x.clone()
    for step in range(STEPS):
        for i, rep in enumerate(reps):
            rep.x.sub_(rep.grad(step, i, workers), alpha=LR)
        if (step + 1) % TAU == 0:
            ds = [rep.x - center for rep in reps]  # all with the same center
            for rep, d in zip(reps, ds, strict=True):
                rep.x.sub_(d, alpha=alpha)
            center.add_(torch.stack(ds).sum(0), alpha=alpha)
    return center, [rep.x for rep in reps]


def reference_local_sgd(workers: int) -> torch.Tensor:
    reps = [_Replica() for _ in range(workers)]
    opts = [torch.optim.SGD(r.model.parameters(), lr=LR, momentum=MU) for r in reps]
    for step in range(STEPS):
        for i, (rep, opt) in enumerate(zip(reps, opts, strict=True)):
            rep.grad(step, i, workers)
            opt.step()
        if (step + 1) % TAU == 0:
            mean = torch.stack([r.x for r in reps]).mean(0)
            for rep in reps:
                rep.x.copy_(mean)
    return reps[0].x


def reference_async_sgd(workers: int, momentum: bool) -> torch.Tensor:
    """Server weights after gradients arrive in the order 1..P per round; each worker's gradient
    (averaged over tau batches) is taken at the weights it last received."""
    server = _Replica()
    w = server.x.clone()
    velocity = torch.zeros_like(w)
    seen = [w.clone() for _ in range(workers)]
    for k in range(STEPS // TAU):
        for i in range(workers):
            server.x.copy_(seen[i])
            g = sum(server.grad(k * TAU + s, i, workers) for s in range(TAU)) / TAU
            if momentum:
                velocity.mul_(MU).sub_(g, alpha=LR)
                w.add_(velocity)
            else:
                w.sub_(g, alpha=LR)
            seen[i] = w.clone()
    return w


def _close(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / np.abs(b).max()) < REL_TOL


# -- the tests ----------------------------------------------------------------------------------
def _all_methods(rank: int, world: int) -> dict:
    """Every deterministic-order check on one 3-rank group (server + 2 workers, or 3 workers)."""
    out = {}
    for method in ("original-easgd", "async-easgd", "async-measgd", "async-sgd", "async-msgd"):
        out[method] = _run(rank, world, method, token=method != "original-easgd")
    # Round-robin keeps its order even when worker 1 is slow; FCFS serves worker 2 first.
    out["rr-slow"] = _run(rank, world, "original-easgd", token=False, slow_first=0.3)
    out["fcfs-slow"] = _run(rank, world, "async-easgd", token=False, slow_first=0.3)
    return out


def _replicated(rank: int, world: int) -> dict:
    return {
        "sync-easgd": _run(rank, world, "sync-easgd", token=False),
        "sync-easgd-again": _run(rank, world, "sync-easgd", token=False),
        # The co-design switches change how the round communicates, not what it computes.
        "sync-easgd-switches": _run(
            rank, world, "sync-easgd", token=False, overlap=False, single_message=False
        ),
        "local-sgd": _run(rank, world, "local-sgd", token=False),
    }


def _server_group(rank: int, world: int) -> dict:
    """The deterministic-order checks, then the worker whose step jumps, on one 3-rank group
    (starting a group costs seconds)."""
    return {
        "methods": _all_methods(rank, world),
        "step-jumper": _step_jumper(rank, world),
        "nan-goodbye": _nan_goodbye(rank, world),
        "lost-before-hello": _lost_before_hello(rank, world),
    }


@pytest.fixture(scope="module")
def server_group() -> list[dict]:
    return run_spawned(_server_group, 3, timeout_s=20)


def test_server_methods_follow_their_update_rules(server_group: list[dict]) -> None:
    server, w1, w2 = (r["methods"] for r in server_group)
    exchanges = STEPS // TAU
    for method, momentum in (
        ("original-easgd", False),
        ("async-easgd", False),
        ("async-measgd", True),
    ):
        center, xs = reference_elastic(2, momentum)
        assert server[method]["arrivals"] == [1, 2] * exchanges, method
        assert _close(server[method]["weights"], center), method
        assert _close(w1[method]["weights"], xs[0]) and _close(w2[method]["weights"], xs[1])
    for method, momentum in (("async-sgd", False), ("async-msgd", True)):
        assert server[method]["arrivals"] == [1, 2] * exchanges, method
        assert _close(server[method]["weights"], reference_async_sgd(2, momentum)), method
    assert server["rr-slow"]["arrivals"] == [1, 2] * exchanges
    # Worker 1 sleeps 0.3 s before each exchange: worker 2 gets served first every time.
    assert server["fcfs-slow"]["arrivals"][0] == 2


def test_replicated_methods_follow_their_update_rules_and_are_deterministic() -> None:
    results = run_spawned(_replicated, 2, timeout_s=30)
    center, xs = reference_sync_easgd(2)
    for rank, res in enumerate(results):
        assert _close(res["sync-easgd"]["center"], center)
        assert _close(res["sync-easgd"]["weights"], xs[rank])
        # Same seed, same data: bitwise identical, and the center is the same on every rank.
        np.testing.assert_array_equal(
            res["sync-easgd"]["center"], res["sync-easgd-again"]["center"]
        )
        np.testing.assert_array_equal(
            res["sync-easgd"]["center"], results[0]["sync-easgd"]["center"]
        )
        assert _close(res["local-sgd"]["weights"], reference_local_sgd(2))


def _mismatched(rank: int, world: int) -> None:
    model = build_model("lenet5" if rank == 2 else "mlp", (1, 8, 8), 10)
    cls = METHODS.get("async-easgd")
    cls(model, MethodContext(_config(), TorchTransport(), torch.device("cpu"))).start()


def test_handshake_refuses_a_worker_with_another_model() -> None:
    with pytest.raises(SpawnedError) as info:
        run_spawned(_mismatched, 3, timeout_s=15)
    message = str(info.value)
    assert "rank 0 failed" in message and TetherError.__name__ in message
    assert "worker rank 2 has a model of" in message and "same --model" in message


def _broken_worker_2(rank: int, broken: Callable[[Any], None], start_broken: bool = True) -> dict:
    """async-easgd on 3 ranks: the server serves, worker 1 trains normally, and worker 2 runs
    ``broken(method)`` instead (after its start, unless ``start_broken`` is False)."""
    cls = METHODS.get("async-easgd")
    method = cls(_model(), MethodContext(_config(), TorchTransport(), torch.device("cpu")))
    if rank != 2 or start_broken:
        method.start()
    if rank == 0:
        result = method.serve(RecordingHooks())
        return {"lost": dict(result.lost_workers), "global_step": result.global_step}
    if rank == 2:
        broken(method)
        return {}
    for step in range(STEPS):
        cross_entropy_step(method, *_batch(step, 0, 2))
    method.finish(PhaseTotals())
    return {"steps": method.local_step}


def _step_jumper(rank: int, world: int) -> dict:
    """Worker 2 sends one exchange claiming a million steps."""
    return _broken_worker_2(
        rank, lambda m: m.wire.send_message(m.flat, 0, MessageKind.PARAMS, step=1_000_000)
    )


def _nan_goodbye(rank: int, world: int) -> dict:
    """Worker 2 says goodbye with NaN totals: int() of a NaN crashed the server's thread, and
    with it every healthy worker."""
    bad = torch.full((TOTALS_WORDS,), float("nan"), dtype=torch.float64)
    return _broken_worker_2(rank, lambda m: m.wire.send_message(bad, 0, MessageKind.STOP, step=0))


def _lost_before_hello(rank: int, world: int) -> dict:
    """Worker 2 connects and is gone before its HELLO: the server's handshake failed the whole
    run, the healthy worker with it."""

    def connect_and_go(method: Any) -> None:
        method.open_wire()
        method.wire.close()

    return _broken_worker_2(rank, connect_and_go, start_broken=False)


@pytest.mark.parametrize(
    "case, reason",
    [
        ("lost-before-hello", "lost before its first exchange"),
        ("nan-goodbye", "protocol: its goodbye's totals are negative or not finite"),
        ("step-jumper", "protocol: its step went from 0 to 1000000"),
    ],
)
def test_a_broken_worker_is_given_up_and_the_run_goes_on(
    server_group: list[dict], case: str, reason: str
) -> None:
    server, worker, _ = (r[case] for r in server_group)
    assert reason in server["lost"][2], server["lost"]
    assert worker["steps"] == STEPS and server["global_step"] < 1000
