"""hogwild-sgd and hogwild-easgd: the update rules, the sharing, and the absence of locks.

the EASGD papers (Zhang et al. 2015; You et al. 2017). ONE spawned group of 3 ranks (server + 2
workers), shared by the tests of this module, drives the methods by hand through several phases,
each on a fresh process group:

- exactness: with one worker updating, or two workers updating strictly one after the other (the
  second waits for a message from the first), the shared weights / center equal a single-process
  reference of the math bitwise (same float32 operations in the same order: tolerance 0);
- sharing: two workers updating concurrently all land in one buffer (every rank reads the same
  bytes afterwards), both workers' steps are counted, the goodbyes arrive, nobody is lost;
- lock-free: workers run with every Python lock constructor and file lock replaced by one that
  raises (a lock made before, the socket wire's per-connection write lock around hogwild-easgd's
  messages to the server, is I/O, not the update); the threaded server's center updates are
  seen running in two threads at once;
- stop: the server's stop flag (or STOP reply) ends every worker early.
"""

from __future__ import annotations

import _thread
import ast
import fcntl
import multiprocessing
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest
import torch
import torch.distributed as dist

import tether.methods.hogwild_sgd as hogwild_sgd
from tests.method_drive import RecordingHooks, cross_entropy_step, loss_and_gradient
from tether.comm.header import MessageKind
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.launch.spawn import run_spawned
from tether.methods import METHODS, MethodContext, Placement
from tether.methods.flat import flatten_parameters
from tether.methods.hogwild_base import single_node
from tether.methods.hogwild_easgd import EXCHANGE_CHANNEL, HogwildEASGD
from tether.methods.hogwild_sgd import HogwildSGD
from tether.models import build_model
from tether.observe.metrics import PhaseTotals

BATCH, LR, WD, TAU, ALPHA = 8, 0.1, 1e-3, 2, 0.3
TURN_CHANNEL = 9  # the sequential phases' "your turn" message between workers
FOREVER = 1_000_000  # steps of a worker that runs until the server says stop


def _config(**change) -> TrainConfig:
    return TrainConfig(**{"lr": LR, "weight_decay": WD, "tau": TAU, "alpha": ALPHA, **change})


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", (1, 8, 8), 10)


def _batch(worker: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * worker + step)
    return torch.randn(BATCH, 1, 8, 8, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


class _Threaded(HogwildEASGD):
    shared_memory = False  # the cross-node variant, forced on one node


class _OverlapProbe(_Threaded):
    """Counts center updates that ran while another thread was inside its own update too."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.meet = threading.Barrier(2, timeout=10)
        self.overlapped = 0

    def move_center(self, d: torch.Tensor) -> None:
        try:  # a lock around the update would keep the second thread out: the barrier breaks
            self.meet.wait()
            self.overlapped += 1
        except threading.BrokenBarrierError:
            pass
        super().move_center(d)


_LOCKS = [
    (threading, "Lock"),
    (threading, "RLock"),
    (threading, "Semaphore"),
    (threading, "BoundedSemaphore"),
    (threading, "Condition"),
    (threading, "Barrier"),
    (_thread, "allocate_lock"),
    (_thread, "RLock"),
    (multiprocessing, "Lock"),
    (multiprocessing, "RLock"),
    (fcntl, "flock"),
    (fcntl, "lockf"),
]


@contextmanager
def _no_locks():
    """Every lock a Python process could take raises while the worker trains."""
    saved = [(mod, name, getattr(mod, name)) for mod, name in _LOCKS if hasattr(mod, name)]

    def refuse(*args, **kwargs):
        raise AssertionError("a lock was taken on the hogwild update path")

    for mod, name, _ in saved:
        setattr(mod, name, refuse)
    try:
        yield
    finally:
        for mod, name, original in saved:
            setattr(mod, name, original)


# -- one phase on every rank ----------------------------------------------------------------------
def _phase(cls, plan, sequential=False, stop_at=None, no_locks=False, **change) -> dict:
    """Run ``cls`` on a fresh group: worker r takes ``plan[r-1]`` steps (FOREVER: until stopped).
    With ``sequential`` worker r starts after worker r-1 finished."""
    rank, world = dist.get_rank(), dist.get_world_size()
    transport = TorchTransport(dist.new_group(list(range(world))))
    method = cls(_model(), MethodContext(_config(**change), transport, torch.device("cpu")))
    if rank == 0:
        method.start()
        hooks = RecordingHooks(stop_at)
        result = method.serve(hooks)
        out = {
            "global_step": result.global_step,
            "lost": dict(result.lost_workers),
            "stopped": sorted(method.server.state.stopped),
            "samples": result.totals.samples,
            "seen": hooks.seen,
            # the steps each worker's loss reports covered (the shared loss board, or headers)
            "loss_steps": [sum(r[3] for r in hooks.losses if r[0] == w) for w in range(1, world)],
            "loss_at": [r[4] for r in hooks.losses],  # the global step each report was logged at
            "overlapped": getattr(method, "overlapped", -1),
            **result.extra,
        }
    else:
        totals = PhaseTotals()
        method.start()  # (its messages to the server are no update: they may take locks)
        with _no_locks() if no_locks else nullcontext():
            turn = torch.empty(0)
            if sequential and rank > 1:
                transport.recv_message(turn, src=rank - 1, channel=TURN_CHANNEL)
            while method.local_step < plan[rank - 1] and not method.stop_requested:
                cross_entropy_step(method, *_batch(rank, method.local_step))
                totals.add(0.0, 0.0, 0.0, BATCH)
            if sequential and rank < world - 1:
                transport.send_message(turn, rank + 1, MessageKind.STOP, channel=TURN_CHANNEL)
        method.finish(totals)
        out = {"x": method.flat.clone(), "steps": method.local_step}
        out["stop_requested"] = method.stop_requested
    transport.barrier()  # every update is done: all ranks read the shared buffer now
    shared = method.eval_model() if rank == 0 else method.model
    if cls is not HogwildSGD and rank > 0:
        shared = None if method.center is None else method.center
    out["shared"] = _flat(shared) if isinstance(shared, torch.nn.Module) else shared
    return out


# -- references: the EASGD papers (Zhang et al. 2015; You et al. 2017) in one process --------------------------------------------
def _reference_sgd(plan: list[int]) -> torch.Tensor:
    """Workers in turn: worker 1's steps, then worker 2's, each w -= lr*(g + wd*w)."""
    model = _model()
    w = flatten_parameters(model)
    for worker, steps in enumerate(plan, start=1):
        for step in range(steps):
            _, grad = loss_and_gradient(model, *_batch(worker, step))
            grad.add_(w, alpha=WD)
            w.sub_(grad, alpha=LR)
    return w.clone()


def _reference_easgd(plan: list[int]) -> dict:
    """Workers in turn; each from the initial weights, exchanging every TAU steps."""
    center = _flat(_model())
    out = {}
    for worker, steps in enumerate(plan, start=1):
        model = _model()
        x = flatten_parameters(model)
        for step in range(steps):  # plain SGD local steps: x <- x - lr * (g + wd * x)
            _, grad = loss_and_gradient(model, *_batch(worker, step))
            x.sub_(grad.add_(x, alpha=WD), alpha=LR)
            if (step + 1) % TAU == 0:
                d = x - center
                x.sub_(d, alpha=ALPHA)
                center.add_(d, alpha=ALPHA)
        out[f"x{worker}"] = x.clone()
    return {"center": center, **out}


def _hogwild_sgd(rank: int, world: int) -> dict:
    out = {
        "one": _phase(HogwildSGD, [5, 0]),
        "turns": _phase(HogwildSGD, [3, 4], sequential=True),
        "together": _phase(HogwildSGD, [40, 40], no_locks=True),
        "stop": _phase(HogwildSGD, [FOREVER, FOREVER], stop_at=5),
    }
    if rank == 0:
        out["ref_one"], out["ref_turns"] = _reference_sgd([5, 0]), _reference_sgd([3, 4])
        out["initial"] = _flat(_model())
    return out


def _hogwild_easgd(rank: int, world: int, cls: type) -> dict:
    out = {
        "one": _phase(cls, [5, 0]),
        "turns": _phase(cls, [3, 4], sequential=True),
        "together": _phase(cls, [20, 20], no_locks=True),
    }
    if cls is _Threaded:
        out["overlap"] = _phase(_OverlapProbe, [1, 1], tau=1)
        out["stop"] = _phase(cls, [FOREVER, FOREVER], stop_at=5, tau=1)
    if rank == 0:
        out["ref_one"], out["ref_turns"] = _reference_easgd([5, 0]), _reference_easgd([3, 4])
        out["initial"] = _flat(_model())
    return out


# -- checks ---------------------------------------------------------------------------------------
def _check_concurrent(phase: list[dict], steps: int, initial: np.ndarray) -> None:
    server, *workers = phase
    assert server["stopped"] == [1, 2] and server["lost"] == {}, "both goodbyes, nobody lost"
    assert server["global_step"] == steps, "both workers' steps are counted"
    assert server["samples"] == 2 * steps * BATCH, "the goodbyes carried both workers' timings"
    assert [w["steps"] for w in workers] == [steps, steps]
    assert not np.array_equal(server["shared"], initial), "the updates moved the shared vector"
    for worker in workers:
        if worker["shared"] is not None:  # every rank reads the same bytes: one buffer
            np.testing.assert_array_equal(worker["shared"], server["shared"])


def _check_stop(phase: list[dict], stop_at: int) -> None:
    server, *workers = phase
    assert server["seen"][-1] >= stop_at and all(s < stop_at for s in server["seen"][:-1])
    assert server["stopped"] == [1, 2] and server["lost"] == {}
    for worker in workers:
        assert worker["stop_requested"] and worker["steps"] < FOREVER


def _short_exchange(rank: int, world: int) -> dict:
    """Threaded hogwild-easgd where worker 2's exchange is one element short (the receive
    buffer takes any length up to the model's): its server thread failed on the subtraction,
    read that as a closed connection and left quietly, and the run waited out the stillness
    timeout. Now the thread gives the worker up for it at once; worker 1 trains on."""
    transport = TorchTransport(dist.new_group(list(range(world))))
    config = _config(timeout_s=10.0)
    method = _Threaded(_model(), MethodContext(config, transport, torch.device("cpu")))
    method.start()
    out: dict = {}
    if rank == 0:
        started = time.monotonic()
        result = method.serve(RecordingHooks())
        out = {"lost": dict(result.lost_workers), "served_s": time.monotonic() - started}
    elif rank == 1:
        for _ in range(4 * TAU):
            cross_entropy_step(method, *_batch(rank, method.local_step))
        method.finish(PhaseTotals())
        out = {"steps": method.local_step}
    else:
        short = method.flat[:-1]
        method.wire.send_message(short, 0, MessageKind.PARAMS, TAU, EXCHANGE_CHANNEL)
    transport.barrier()
    return out


def _all_phases(rank: int, world: int) -> dict:
    return {
        "sgd": _hogwild_sgd(rank, world),
        "shared-memory": _hogwild_easgd(rank, world, HogwildEASGD),
        "threads": _hogwild_easgd(rank, world, _Threaded),
        "short": _short_exchange(rank, world),
    }


@pytest.fixture(scope="module")
def phases() -> list[dict]:
    """Every rank's results of every phase (starting a group costs seconds: one for all)."""
    return run_spawned(_all_phases, 3, timeout_s=60)


def test_hogwild_sgd_shares_one_weight_buffer_without_locks(phases: list[dict]) -> None:
    ranks = [r["sgd"] for r in phases]
    server = ranks[0]
    for name, plan in (("one", [5, 0]), ("turns", [3, 4])):
        ref = server[f"ref_{name}"]
        np.testing.assert_array_equal(server[name]["shared"], ref)
        for worker in ranks[1:]:  # a worker's model is a view of the same shared weights
            np.testing.assert_array_equal(worker[name]["shared"], ref)
        assert server[name]["global_step"] == sum(plan) // 2
        assert server[name]["updates"] == sum(plan)
        assert server[name]["loss_steps"] == plan  # every step's loss, from the shared board
        # at the step the workers had reached, not the last progress reported, which an
        # evaluation they trained through left behind (lines of steps 9-40 logged at 10)
        assert max(server[name]["loss_at"]) == server[name]["global_step"]
    phase = [r["together"] for r in ranks]
    _check_concurrent(phase, 40, server["initial"])
    assert server["together"]["updates"] == 80
    _check_stop([r["stop"] for r in ranks], 5)


@pytest.mark.parametrize("cls", [HogwildEASGD, _Threaded], ids=["shared-memory", "threads"])
def test_hogwild_easgd_follows_the_elastic_rule_without_locks(
    phases: list[dict], cls: type
) -> None:
    ranks = [r["shared-memory" if cls is HogwildEASGD else "threads"] for r in phases]
    server, w1, w2 = ranks
    assert server["one"]["shared_memory"] is (cls is HogwildEASGD)
    for name, plan in (("one", [5, 0]), ("turns", [3, 4])):
        ref = server[f"ref_{name}"]
        np.testing.assert_array_equal(server[name]["shared"], ref["center"])
        np.testing.assert_array_equal(w1[name]["x"], ref["x1"])
        np.testing.assert_array_equal(w2[name]["x"], ref["x2"])
        assert server[name]["exchanges"] == sum(p // TAU for p in plan)
        assert server[name]["global_step"] == sum(plan) // 2
        assert server[name]["alpha"] == ALPHA and server[name]["tau"] == TAU
        # the board has every step's loss; the threads get them with the exchanges (every TAU)
        reported = plan if cls is HogwildEASGD else [p // TAU * TAU for p in plan]
        assert server[name]["loss_steps"] == reported
    _check_concurrent([r["together"] for r in ranks], 20, server["initial"])
    assert server["together"]["exchanges"] == 20
    if cls is _Threaded:
        assert server["overlap"]["overlapped"] == 2, "two center updates ran at the same time"
        _check_stop([r["stop"] for r in ranks], 5)


# -- no spawned group needed ----------------------------------------------------------------------
METHOD_FILES = ["hogwild_base.py", "hogwild_sgd.py", "hogwild_easgd.py", "shared_memory.py"]
LOCK_NAMES = {name for _, name in _LOCKS} | {"Lock", "RLock", "Event"}


def test_hogwild_modules_name_no_locking_primitive() -> None:
    root = Path(hogwild_sgd.__file__).parent
    for file in METHOD_FILES:
        tree = ast.parse((root / file).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not names & LOCK_NAMES, (file, names & LOCK_NAMES)


def _fake_context(rank: int, local_world_size: int | None = None) -> MethodContext:
    transport = SimpleNamespace(rank=rank, world_size=3)
    placement = Placement(local_world_size=local_world_size)
    return MethodContext(_config(), transport, torch.device("cpu"), placement)  # type: ignore[arg-type]


def test_across_nodes_sgd_refuses_and_easgd_uses_server_threads() -> None:
    assert single_node(_fake_context(0, local_world_size=3))
    assert single_node(_fake_context(0))  # no launcher: every rank on this node
    assert not single_node(_fake_context(0, local_world_size=1))
    with pytest.raises(TetherError, match=r"one node.*async-sgd"):
        METHODS.get("hogwild-sgd")(_model(), _fake_context(1, local_world_size=1))
    method = METHODS.get("hogwild-easgd")(_model(), _fake_context(1, local_world_size=1))
    assert not method.use_shared
    assert METHODS.get("hogwild-easgd")(_model(), _fake_context(1, local_world_size=3)).use_shared


class _Forced(HogwildEASGD):
    shared_memory: ClassVar[bool | None] = True


def test_the_class_attribute_forces_the_mode() -> None:
    assert _Forced(_model(), _fake_context(2, local_world_size=1)).use_shared


def test_a_short_exchange_gives_its_worker_up_and_the_run_goes_on(phases: list[dict]) -> None:
    server, worker, _ = (r["short"] for r in phases)
    elements = _flat(_model()).numel()
    assert f"its PARAMS has {elements - 1} elements, not {elements}" in server["lost"][2]
    assert 1 not in server["lost"] and worker["steps"] == 4 * TAU
    assert server["served_s"] < 5.0  # given up at once, not after the 10 s stillness timeout
