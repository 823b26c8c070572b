"""Every method on the user's own model, data, loss, optimizer and schedule (the one step seam),
through the trainer and through ``ctx.wrap`` in a user's loop, in one spawned group of 3 ranks.

- Each of the methods trains a user-defined module on scikit-learn's breast-cancer data with a
  label-smoothed loss and AdamW: the test loss falls below the untrained model's and the
  accuracy beats the majority class (63%) by a stated margin; metrics.jsonl holds every step's
  training loss (each worker's, for the methods with a server).
- sync-sgd in a user's loop (``ctx.wrap``, ``ctx.sampler``, a DataLoader) equals one process on
  the global batch (1e-5 relative) and PyTorch DDP; sync-easgd is bitwise deterministic there
  and through the trainer.
- A run resumed from its checkpoint with AdamW and a cosine schedule ends bitwise equal to an
  uninterrupted one, on a model with dropout (the random state is checkpointed too); so does
  one interrupted past its checkpoint whose training data is a plain dataset read through a
  DataLoader (which draws no random number of the run's). The resumed run's summary covers the
  whole run (rounds, and samples over the whole training time, the time split at least the first
  part's) and times the target it runs with, not the checkpoint's. A run checkpoints its last
  step too, a multiple of checkpoint_every or not; a resume with nothing left to do (a setting
  it may change changed) leaves the finished run's summary, metrics, config, checkpoint and
  model as they were; so does one that stopped at its target (checkpointed where it stopped),
  which another target takes on to its end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tether.api.context import Context
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data.sharding import GlobalBatchSampler
from tether.launch.env import DistEnv
from tether.launch.spawn import run_spawned
from tether.methods import METHODS, Placement
from tether.metrics import accuracy
from tether.optim import NamedSchedule, ScheduleSettings
from tether.training.task import Task
from tether.training.trainer import Trainer, WorkerRuntime

WORLD = 3
CHANCE = 0.63  # the majority class's share of the evaluation split
MARGIN = 0.20  # every method must beat it by this much: >= 83% accuracy
LR, BATCH, STEPS = 0.01, 16, 60
WRAP_STEPS, WRAP_BATCH, REL_TOL = 6, 8, 1e-5
USER_CLIP = 0.05  # well below the gradients' norm: every step is clipped
CPU = torch.device("cpu")
SMOOTHED = nn.CrossEntropyLoss(label_smoothing=0.05)  # the user's loss


def data() -> tuple[TensorDataset, TensorDataset]:
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    order = np.random.default_rng(0).permutation(len(y))
    xs = torch.tensor(x[order], dtype=torch.float32)
    ys = torch.tensor(y[order], dtype=torch.int64)
    return TensorDataset(xs[:400], ys[:400]), TensorDataset(xs[400:], ys[400:])


class Net(nn.Module):
    """The user's own module."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(30, 16)
        self.out = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


class DropNet(Net):
    """The user's module with dropout: training draws random numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.relu(self.hidden(x))))


class Rows(Dataset):
    """A plain map-style dataset (batches come through a DataLoader)."""

    def __init__(self, data: TensorDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return self.data[index]


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, weight_decay=1e-4)


def cosine(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2 * 10)


def _task(**change: Any) -> Task:
    train, test = data()
    fields = {
        "model": Net,
        "train_data": train,
        "eval_data": test,
        "loss": SMOOTHED,
        "optimizer": adamw,
        "metrics": {"accuracy": accuracy},
        "model_name": "Net",
        "data_name": "breast-cancer",
        **change,
    }
    return Task(**fields)


def _train(root: Path, name: str, task: Task, **change: Any) -> dict[str, Any]:
    """One trainer run on this group; rank 0 returns its summary, every rank where its
    learning-rate schedule stands against the run's global step (``schedule``)."""
    method = change.get("method", "sync-sgd")
    servers = METHODS.get(method).server_processes
    values = {
        "method": method,
        "workers": WORLD - servers,
        "batch_size": BATCH,
        "tau": 2,
        "steps": STEPS,
        "eval_every": STEPS // 2,
        "out": str(root / name),
        "progress": False,
        "timeout_s": 30.0,
        **change,
    }
    runtime = WorkerRuntime(TorchTransport(), CPU, Placement(run_id=name))
    trainer = Trainer(TrainConfig(**values), task, runtime)
    trainer.run()
    dist.barrier()  # the next run's handshake must not reach this run's server
    summary = root / name / "summary.json"
    out = json.loads(summary.read_text()) if dist.get_rank() == 0 else {}
    method = trainer.method
    if method.scheduler is not None and hasattr(method, "link"):  # a worker of a server method
        out["schedule"] = (method.scheduler.last_epoch, method.link.global_step, method.local_step)
    return out


def _weights(path: Path) -> np.ndarray:
    state = torch.load(path, weights_only=True)
    return torch.cat([t.reshape(-1).float() for t in state.values()]).numpy()


def _wrap_loop(
    rank: int, world: int, method: str, seed: int = 3, clip: float | None = None
) -> np.ndarray:
    """The user's loop of docs/api.md on ``ctx.wrap``: returns the evaluated model's weights.
    ``clip``: the user clips the gradient's norm between backward and step, as under DDP."""
    train, _ = data()
    config = TrainConfig(method=method, workers=world, batch_size=WRAP_BATCH, seed=seed, lr=0.4)
    env = DistEnv(rank, world, rank, world, "127.0.0.1", None, None)
    ctx = Context(config, TorchTransport(), CPU, env, Placement(local_world_size=world))
    torch.manual_seed(0)
    model = Net()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if method == "sync-sgd" else None
    )
    model, wrapped = ctx.wrap(model, opt)
    loader = DataLoader(train, batch_size=WRAP_BATCH, sampler=ctx.sampler(train))
    for step, (x, y) in enumerate(loader):
        if step == WRAP_STEPS:
            break
        wrapped.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        wrapped.step()
    flat = torch.cat([p.detach().reshape(-1) for p in ctx.eval_model().parameters()])
    ctx.method.finish(None)  # type: ignore[union-attr]  (the spawn helper ends the group)
    return flat.clone().numpy()


def _ddp(rank: int, world: int) -> np.ndarray:
    train, _ = data()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Net())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    sampler = GlobalBatchSampler(len(train), WRAP_BATCH * world, seed=3)
    x, y = train.tensors
    for step in range(WRAP_STEPS):
        idx = sampler.worker_indices(step, rank, world)
        opt.zero_grad()
        F.cross_entropy(ddp(x[idx]), y[idx]).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()]).numpy()


def _everything(rank: int, world: int, root: str) -> dict[str, Any]:
    base = Path(root)
    out: dict[str, Any] = {}
    for method in METHODS:
        # The asynchronous methods with a schedule: it must follow the run's global step.
        schedule = cosine if METHODS.get(method).server_processes else None
        out[method] = _train(base, method, _task(scheduler=schedule), method=method)
    # Accumulation: 2 backward passes of 4 per update equal one of 8 (sync-sgd, plain SGD).
    _train(
        base,
        "accumulated",
        _task(optimizer=None),
        lr=0.1,
        momentum=0.0,
        batch_size=4,
        accumulate=2,
        steps=5,
        eval_every=5,
    )
    out["accumulated"] = _weights(base / "accumulated" / "model.pt")
    # Clipping after the all-reduce: 3 workers x 8 clip the mean gradient as one process would.
    _train(
        base,
        "clipped",
        _task(optimizer=None),
        lr=0.1,
        momentum=0.0,
        batch_size=8,
        steps=5,
        eval_every=5,
        clip_grad_norm=0.05,
    )
    out["clipped"] = _weights(base / "clipped" / "model.pt")
    # sync-easgd twice: bitwise the same weights
    for name in ("easgd-a", "easgd-b"):
        _train(base, name, _task(optimizer=None), method="sync-easgd", lr=0.4, steps=20)
    # resume: 20 steps at once, or 10, a checkpoint, and 10 more from it
    resumable = _task(scheduler=cosine, model=DropNet)
    _train(base, "whole", resumable, steps=20)
    # neither run's last step is a multiple; traced, as a user's run may be (its trace is kept)
    part = {"steps": 20, "checkpoint_every": 8, "timeline": True}
    first = {"steps": 10, "target": "loss<=100"}  # reached at the first evaluation
    out["part-first"] = _train(base, "part", resumable, **(part | first))
    saved = torch.load(base / "part" / "checkpoint.pt", weights_only=True) if rank == 0 else {}
    out["part-first-checkpoint"] = saved.get("step")
    # resumed with another target, which no evaluation reaches
    out["part-resumed"] = _train(base, "part", resumable, **part, target="loss<=0", resume=True)
    kept = ("metrics.jsonl", "config.toml", "checkpoint.pt", "model.pt")
    traced = [f"timeline/rank{rank}.json"] + ["timeline.json"] * (rank == 0)  # each its own
    files = [(base / "part" / n).read_bytes() for n in kept] if rank == 0 else []
    traces = [(base / "part" / n).read_bytes() for n in traced]
    # nothing left to do, with a setting a resume may change: every file stays as it was
    out["part-again"] = _train(base, "part", resumable, **part, resume=True, timeout_s=29.0)
    if rank == 0:
        out["part-files-kept"] = files == [(base / "part" / n).read_bytes() for n in kept]
    out["part-trace-kept"] = traces == [(base / "part" / n).read_bytes() for n in traced]
    # Stopped at its target at step 5, checkpointing every 3: it checkpoints the step it
    # stopped at (it saved 3 alone, and a resume ran steps 4-5 again and rewrote its files);
    # resumed as it was, it has nothing left to do; resumed with another target, it goes on.
    stop = {"steps": 20, "eval_every": 5, "checkpoint_every": 3}
    stop |= {"target": "loss<=100", "stop_at_target": True}
    out["target-stop"] = _train(base, "target-stop", resumable, **stop)
    saved = (
        torch.load(base / "target-stop" / "checkpoint.pt", weights_only=True) if rank == 0 else {}
    )
    out["target-stop-checkpoint"] = saved.get("step")
    files = [(base / "target-stop" / n).read_bytes() for n in kept] if rank == 0 else []
    out["target-again"] = _train(base, "target-stop", resumable, **stop, resume=True)
    if rank == 0:
        out["target-kept"] = files == [(base / "target-stop" / n).read_bytes() for n in kept]
    further = stop | {"target": "loss<=0"}
    out["target-further"] = _train(base, "target-stop", resumable, **further, resume=True)
    # The same with a named schedule (warm-up, then cosine over the run's 20 steps): the
    # interrupted run stops at its step-10 evaluation (a target it meets at once) as a crash
    # there would leave it (without the checkpoint of the step a run stops at), its last
    # checkpoint at step 5, and the resumed run goes on from there to step 20.
    named = _task(
        scheduler=NamedSchedule("cosine", ScheduleSettings(warmup_steps=4)),
        model=DropNet,
        train_data=Rows(data()[0]),
    )
    _train(base, "named-whole", named, steps=20, eval_every=10)
    with mock.patch.object(Trainer, "_checkpoint_end", lambda self, step: None):  # a crash
        _train(
            base,
            "named-part",
            named,
            steps=20,
            eval_every=10,
            checkpoint_every=5,
            target="loss<=100",
            stop_at_target=True,
        )
    _train(base, "named-part", named, steps=20, eval_every=10, resume=True)
    out["wrap-sync-sgd"] = _wrap_loop(rank, world, "sync-sgd")
    out["wrap-sync-sgd-clipped"] = _wrap_loop(rank, world, "sync-sgd", clip=USER_CLIP)
    out["ddp"] = _ddp(rank, world)
    out["wrap-easgd-a"] = _wrap_loop(rank, world, "sync-easgd")
    out["wrap-easgd-b"] = _wrap_loop(rank, world, "sync-easgd")
    out["slow-merge"] = _slow_timeline_merge(base)
    return out


def _slow_timeline_merge(base: Path) -> dict[str, Any]:
    """A parameter server with no supervisor (these ranks have none) watches its own pulse
    after serving, and the timeline's merge, after the results, never beats: a merge longer
    than --timeout (here made 3 s against 2 s) got a healthy, finished server killed
    (found by review). The watch ends once the results are written."""
    original = Trainer._save_timeline

    def slow(self: Trainer, merge: bool = False) -> None:
        if merge:
            time.sleep(3.0)
        original(self, merge)

    with mock.patch.object(Trainer, "_save_timeline", slow):
        return _train(base, "slow-merge", _task(), method="async-sgd", timeline=True, timeout_s=2.0)


def _single_process(clip: float | None = None) -> np.ndarray:
    train, _ = data()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = GlobalBatchSampler(len(train), WRAP_BATCH * WORLD, seed=3)
    x, y = train.tensors
    for step in range(WRAP_STEPS):
        idx = sampler.global_indices(step)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def _single_process_sgd(
    per_worker: int, accumulate: int = 1, clip: float | None = None
) -> np.ndarray:
    """Plain SGD in one process on what the 3 workers see together: ``accumulate`` consecutive
    global batches of ``per_worker * 3`` per update, the gradient clipped to ``clip``."""
    train, _ = data()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = GlobalBatchSampler(len(train), per_worker * WORLD, seed=0)
    x, y = train.tensors
    for step in range(5):
        idx = torch.cat([sampler.global_indices(accumulate * step + k) for k in range(accumulate)])
        opt.zero_grad()
        SMOOTHED(model(x[idx]), y[idx]).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), clip)
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()]).numpy()


def _untrained_loss() -> float:
    _, test = data()
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        return float(
            nn.CrossEntropyLoss(label_smoothing=0.05)(model(test.tensors[0]), test.tensors[1])
        )


def _mean_loss(reports: list[dict[str, Any]]) -> float:
    return sum(r["loss"] * r["loss_steps"] for r in reports) / sum(r["loss_steps"] for r in reports)


def _check_step_losses(path: Path, method: str) -> None:
    """metrics.jsonl holds the training loss of every step: rank 0's per step (replicated
    methods), or each worker's, reported to the server with its messages (or on the shared
    loss board) and covering every step it took, falling as it trains."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    # one evaluation line per step (a server evaluated its last step twice, same numbers), but
    # for the saved model's when the weights moved after its step's evaluation (Hogwild's
    # workers train on while the server evaluates): marked final
    evaluations = [r for r in records if r.get("event") == "eval"]
    evaluated = [r["step"] for r in evaluations if not r.get("final")]
    assert len(evaluated) == len(set(evaluated)) and evaluated, (method, evaluated)
    finals = [r["step"] for r in evaluations if r.get("final")]
    assert finals in ([], [evaluated[-1]]), (method, evaluations)
    losses = [r for r in records if "loss" in r and "event" not in r]
    clock = [r["time_s"] for r in losses]  # the training clock, for loss-against-time curves
    assert clock == sorted(clock) and clock[0] >= 0, (method, clock)
    if not METHODS.get(method).server_processes:
        assert [r["step"] for r in losses] == list(range(1, STEPS + 1)), method
        return
    for rank in range(1, WORLD):
        mine = [r for r in losses if r.get("worker") == rank]
        covered = sum(r["loss_steps"] for r in mine)
        # up to tau steps after its last message (the goodbye carries no loss), or a board
        # read between a loss and its step count (Hogwild)
        assert STEPS - 2 <= covered <= STEPS, (method, rank, covered)
        assert abs(covered - mine[-1]["worker_step"]) <= 2, (method, rank, mine[-1])
        assert all(0 < r["loss"] < 10 for r in mine), (method, rank)
        if len(mine) >= 2:  # (Hogwild's board is read every 15 ms: a fast worker may be done)
            half = len(mine) // 2
            first, last = mine[:half], mine[-half:]
            assert _mean_loss(last) < _mean_loss(first), (method, rank, first, last)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_every_method_trains_the_users_task_and_the_wrap_path_is_exact(tmp_path: Path) -> None:
    results = run_spawned(_everything, WORLD, str(tmp_path), timeout_s=60)
    summaries = results[0]
    assert summaries["slow-merge"]["steps"] > 0  # the server lived through its slow merge
    start = _untrained_loss()
    for method in METHODS:
        summary = summaries[method]
        final = summary["final_metrics"]
        assert final["accuracy"] >= CHANCE + MARGIN, (method, final)
        assert final["loss"] < start, (method, final["loss"], start)
        assert summary["optimizer"] == "AdamW" and summary["model"] == "Net", method
        _check_step_losses(tmp_path / method / "metrics.jsonl", method)
    for method in ("original-easgd", "async-easgd", "async-measgd"):
        for rank in range(1, WORLD):  # the schedule stands at the global step the server sent
            position, global_step, own = results[rank][method]["schedule"]
            assert position == global_step and global_step > 0, (method, rank, position, own)
    assert _rel(results[0]["accumulated"], _single_process_sgd(4, accumulate=2)) < REL_TOL
    clipped = _single_process_sgd(8, clip=0.05)
    assert _rel(results[0]["clipped"], clipped) < REL_TOL
    assert _rel(clipped, _single_process_sgd(8)) > 1e-3  # the clip was active
    a, b = (_weights(tmp_path / n / "model.pt") for n in ("easgd-a", "easgd-b"))
    assert np.array_equal(a, b)
    whole, resumed = (_weights(tmp_path / n / "model.pt") for n in ("whole", "part"))
    assert np.array_equal(whole, resumed)
    first, part = summaries["part-first"], summaries["part-resumed"]
    assert part["rounds"] == 20, part["rounds"]
    samples = 20 * BATCH * WORLD  # every step's, the first part's too, over the whole training time
    assert part["samples_per_s"] * part["training_time_s"] == pytest.approx(samples)
    assert all(part["time_split_s"][k] >= v > 0 for k, v in first["time_split_s"].items())
    assert part["comm_fraction"] > 0
    # the time to target is the resumed run's target's (not reached), not the first part's
    assert first["time_to_target_s"] is not None
    assert part["target"] == "loss<=0" and part["time_to_target_s"] is None
    # each run checkpointed its last step: the resume went on from step 10, not 8
    assert summaries["part-first-checkpoint"] == 10
    assert summaries["part-again"] == part  # finished: kept as it was
    assert summaries["part-files-kept"] is True
    assert all(results[rank]["part-trace-kept"] for rank in range(WORLD))  # it was rewritten
    stopped = summaries["target-stop"]
    assert stopped["steps"] == 5 and summaries["target-stop-checkpoint"] == 5
    assert summaries["target-again"] == stopped and summaries["target-kept"] is True
    assert summaries["target-further"]["steps"] == 20
    named_whole, named_resumed = (
        _weights(tmp_path / n / "model.pt") for n in ("named-whole", "named-part")
    )
    assert np.array_equal(named_whole, named_resumed)
    assert not np.array_equal(named_whole, whole)  # the schedules differ: not the same run
    single, user_clipped = _single_process(), _single_process(clip=USER_CLIP)
    assert _rel(user_clipped, single) > 1e-3  # the user's clip was active
    for rank in range(WORLD):
        assert _rel(results[rank]["wrap-sync-sgd"], single) < REL_TOL
        assert _rel(results[rank]["wrap-sync-sgd"], results[rank]["ddp"]) < REL_TOL
        # Gradients are final when backward returns, as under DDP: a clip there sees the mean
        # (it raced with the all-reduces still in flight until opt.step()).
        assert _rel(results[rank]["wrap-sync-sgd-clipped"], user_clipped) < REL_TOL
        assert np.array_equal(results[rank]["wrap-easgd-a"], results[rank]["wrap-easgd-b"])
    assert np.array_equal(results[0]["wrap-easgd-a"], results[1]["wrap-easgd-a"])
    # The wrap loop moved the weights (a loop that did nothing would also be "deterministic").
    assert _rel(results[0]["wrap-easgd-a"], single) > 1e-3
