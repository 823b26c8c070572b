"""Checkpoints through the trainer, on a spawned group of 4 ranks (shared with
test_two_level_easgd.py: tests/distributed/conftest.py; starting a group costs seconds, and
`tether train` end to end ten or more per run, tests/entry/test_train_e2e.py).

- Per-rank shards: sync-easgd, local-sgd and two-level-easgd (2 nodes of 2) checkpoint every
  rank's own replica and optimizer. A run interrupted after its checkpoint at step 20 (it stops
  at its step-25 evaluation, as a crash at step 25 would leave it: without the checkpoint of the
  step a run stops at) and resumed ends bitwise equal
  to the uninterrupted run, with the same test metrics. The averaging period (tau 3) puts the
  checkpoint between two averagings, where the replicas differ: a resume from one replica (the
  center, or rank 0's) would not give the same weights. The model has dropout and in training
  adds noise drawn from Python's and NumPy's global generators (as a user's augmentation may):
  every rank's random state, all three generators', is in its shard too (before Python's and
  NumPy's were seeded and kept, the runs differed from their first step).
- original-easgd (a server and 3 workers, round-robin): the workers keep their own replicas
  too. The server checkpoints only at the end of a round (step 21: the round ending at 12,
  then the first round end after 20), where every worker saves its shard; interrupted at its
  evaluation at step 25 (mid-round) and resumed, it ends bitwise equal to the uninterrupted run.
- The resumed runs' summaries cover the whole run: the uninterrupted run's rounds, and every
  step's samples over the whole training time (the ranks' phase totals summed at the checkpoint;
  original-easgd's workers keep theirs in their shards and report them to the server).
- sync-easgd evaluates and saves its center: rounds, tau and alpha as the summary reports them.
- original-easgd ending mid-round does not checkpoint its last step, where its workers keep no
  shard: it resumes from the round end before, without a warning.
- async-easgd: the server checkpoints the run's last step (not a multiple of checkpoint_every)
  once its workers are done, each worker its optimizer at its last step; a resume with nothing
  left to do leaves the finished run's results as they were (the checkpoint's center; the
  summary's numbers).
- async-sgd stopped at its target at step 8 checkpoints there (its end, not a multiple of
  checkpoint_every) and, resumed without the target, goes on to step 12: its rounds (every push,
  3 workers x 12) and its stale gradients dropped count the updates before the checkpoint too.
- async-easgd with momentum SGD in fp16: every worker keeps its own velocity and loss scale
  across a resume (they started afresh before: momentum from zero, the scale from its initial
  value), and its schedule starts at the checkpoint's step, however far (hogwild-easgd's too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import random
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

import tether.methods.base as base_module
import tether.training.trainer as trainer_module
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.methods import METHODS, Placement
from tether.metrics import accuracy
from tether.training.checkpoint import shard_path
from tether.training.run_checkpoints import RunCheckpoints
from tether.training.task import Task
from tether.training.trainer import Trainer, WorkerRuntime

WORLD = 4
CPU = torch.device("cpu")
STEPS, CHECKPOINT_EVERY, TAU = 30, 10, 3  # the checkpoint at step 20 falls between averagings
STOP = 25  # the interrupted run's evaluation (and stop) step: after its last checkpoint
RUNS = ("whole", "interrupted")
REPLICATED = {
    "sync-easgd": {},
    "local-sgd": {},
    "two-level-easgd": {"ranks_per_node": 2},
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.2)  # training draws random numbers: each rank's own state
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:  # a user's noise from the other global generators
            x = x + 0.1 * (random.random() - 0.5) + 0.1 * float(np.random.randn())
        return self.out(self.drop(torch.relu(self.hidden(x))))


def _task() -> Task:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(480, 8, generator=gen)
    y = (x @ torch.randn(8, 3, generator=gen)).argmax(1)
    return Task(
        model=Net,
        train_data=TensorDataset(x[:384], y[:384]),
        eval_data=TensorDataset(x[384:], y[384:]),
        loss=nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        model_name="Net",
    )


def _momentum_sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _cosine(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)


def _train(run: Path, optimizer: Any = None, scheduler: Any = None, **change: Any) -> Trainer:
    method = change["method"]
    values = {
        "workers": WORLD - METHODS.get(method).server_processes,
        "batch_size": 8,
        "lr": 0.1,
        "out": str(run),
        "progress": False,
        "timeout_s": 30.0,
        **change,
    }
    runtime = WorkerRuntime(TorchTransport(), CPU, Placement(run_id=run.name))
    task = dataclasses.replace(_task(), optimizer=optimizer, scheduler=scheduler)
    trainer = Trainer(TrainConfig(**values), task, runtime)
    trainer.run()
    dist.barrier()  # the next run's handshake must not reach this run's server
    return trainer


def _stopped_as_by_a_crash(run: Path, **settings: Any) -> None:
    """A run that stops at its evaluation at step 25 (a target it meets at once) as a crash
    there would leave it: without the checkpoint a run saves at the step it stops at (the
    server's, and a server's workers' own), so its last checkpoint is the one at step 20."""
    own = RunCheckpoints.save_own_when_due

    def periodic_only(self: RunCheckpoints, step: int, last: bool = False) -> None:
        if not last:
            own(self, step)

    with (
        mock.patch.object(Trainer, "_checkpoint_end", lambda self, step: None),
        mock.patch.object(RunCheckpoints, "save_own_when_due", periodic_only),
    ):
        _train(run, **settings, target="loss<=100", stop_at_target=True)


def on_every_rank(rank: int, world: int, root: str) -> dict[str, Any]:
    """This module's part of the 4-rank group (tests/distributed/conftest.py)."""
    base = Path(root) / "shard-resume"
    out: dict[str, Any] = {}
    for method, layout in REPLICATED.items():
        common = {"method": method, "steps": STEPS, "tau": TAU, **layout}
        common |= {"eval_every": STOP, "checkpoint_every": CHECKPOINT_EVERY}
        trainer = _train(base / method / "whole", **common)
        if method == "sync-easgd" and rank == 0:
            out["sync-easgd-center"] = trainer.method.center.clone()  # type: ignore[attr-defined]
        interrupted = base / method / "interrupted"
        _stopped_as_by_a_crash(interrupted, **common)
        if rank == 0:
            checkpoint = torch.load(interrupted / "checkpoint.pt", weights_only=True)
            shards = sorted((interrupted / "checkpoint-ranks").iterdir())
            out[method] = {
                "checkpoint_step": checkpoint["step"],
                "shards": [p.name for p in shards],
                "steps": [torch.load(p, weights_only=True)["step"] for p in shards],
                "replicas": [_flat(torch.load(p, weights_only=True)["model"]) for p in shards],
            }
        dist.barrier()  # rank 0 has read the shards before the resume overwrites them
        _train(interrupted, **common, resume=True)
        if rank == 0:
            out[method]["summaries"] = [_summary(base / method / n) for n in RUNS]
    # original-easgd: the same, its interrupted run stopped by the server at its evaluation
    common = {"method": "original-easgd", "steps": STEPS, "tau": TAU}
    common |= {"eval_every": STOP, "checkpoint_every": CHECKPOINT_EVERY}
    # The run's files (a server's TensorBoard writer takes a while to open) before the start:
    # opened after it, the wait counted as its workers' communication.
    order: list[str] = []
    opened, started = trainer_module.open_run_files, METHODS.get("original-easgd").start
    with (
        mock.patch.object(trainer_module, "open_run_files", lambda *a: order.append("files") or opened(*a)),
        mock.patch.object(METHODS.get("original-easgd"), "start", lambda m, s: order.append("start") or started(m, s)),
    ):  # fmt: skip
        _train(base / "original-easgd" / "whole", **common)
    out["files-then-start"] = order
    interrupted = base / "original-easgd" / "interrupted"
    _stopped_as_by_a_crash(interrupted, **common)
    if rank == 0:
        checkpoint = torch.load(interrupted / "checkpoint.pt", weights_only=True)
        shards = sorted((interrupted / "checkpoint-ranks").iterdir())
        out["original-easgd"] = {
            "checkpoint_step": checkpoint["step"],
            "shards": [p.name for p in shards],
            "steps": [torch.load(p, weights_only=True)["step"] for p in shards],
            "replicas": [_flat(torch.load(p, weights_only=True)["model"]) for p in shards],
            "center": _flat(checkpoint["model"]),
        }
    dist.barrier()
    said = io.StringIO()  # the server, which has no shard, warned that one was missing
    with contextlib.redirect_stderr(said):
        _train(interrupted, **common, resume=True)
    if rank == 0:
        out["original-easgd"]["resume_stderr"] = said.getvalue()
        out["original-easgd"]["summaries"] = [_summary(base / "original-easgd" / n) for n in RUNS]
    # original-easgd ending mid-round (10 steps of rounds of 3): no checkpoint of its last
    # step, where no worker keeps a shard (a resume warned of missing shards and restarted
    # every worker from the center); its last is at the round end 9, and resumes bitwise
    run = base / "original-easgd-mid-round"
    settings = {"method": "original-easgd", "steps": 10, "tau": TAU, "checkpoint_every": 4}
    _train(run, **settings)
    if rank == 0:
        saved = torch.load(run / "checkpoint.pt", weights_only=True)
        out["original-easgd-mid-round"] = {"step": saved["step"]}
    dist.barrier()
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        _train(run, **settings, resume=True)
    if rank == 0:
        out["original-easgd-mid-round"]["resume_stderr"] = said.getvalue()
    # async-easgd: 10 steps, checkpoints every 4 and at the last, then a resume with nothing
    # to do
    run = base / "async-easgd"
    settings = {"method": "async-easgd", "steps": 10, "tau": 1, "checkpoint_every": 4}
    served = _train(run, **settings, eval_every=10)
    if rank == 0:
        checkpoint = torch.load(run / "checkpoint.pt", weights_only=True)
        out["async-easgd"] = {"step": checkpoint["step"], "center": _flat(checkpoint["model"])}
        # the time it checkpointed and evaluated, told to its workers in each reply
        out["async-easgd"]["server_busy_s"] = served.method.server.busy_s  # type: ignore[attr-defined]
        shards = sorted((run / "checkpoint-ranks").iterdir())
        out["async-easgd"]["shards"] = [torch.load(p, weights_only=True)["step"] for p in shards]
        out["async-easgd"]["finished"] = _summary(run)
    dist.barrier()
    _train(run, **settings, eval_every=10, resume=True)
    if rank == 0:
        out["async-easgd"]["kept"] = _summary(run)
    # async-sgd, every stale gradient dropped: stopped at its evaluation at step 8 (the server
    # checkpoints there, the run's end, though every 5 is due at 10), then resumed without the
    # target to step 12
    run = base / "async-sgd"
    settings = {"method": "async-sgd", "steps": 12, "tau": 1, "checkpoint_every": 5}
    settings |= {"staleness_bound": 0, "eval_every": 8}
    _train(run, **settings, target="loss<=100", stop_at_target=True)
    if rank == 0:
        out["async-sgd"] = {"saved": torch.load(run / "checkpoint.pt", weights_only=True)}
        out["async-sgd"]["stopped"] = _summary(run)
    dist.barrier()
    _train(run, **settings, resume=True)
    if rank == 0:
        out["async-sgd"]["summary"] = _summary(run)
    # async-easgd, momentum SGD: each worker's own velocity and loss scale (growing every 2
    # clean steps)
    run = base / "async-easgd-momentum"
    settings = {"method": "async-easgd", "steps": 12, "tau": 1, "checkpoint_every": 4}
    settings |= {"precision": "fp16", "loss_scale_growth_interval": 2, "eval_every": 12}
    _train(run, _momentum_sgd, _cosine, **settings)
    saved = torch.load(shard_path(run, rank), weights_only=True) if rank else None
    dist.barrier()  # every worker has read its save before the resume
    # A resumed worker moves its schedule to the checkpoint's step at once, however far: the
    # limit on a server's report (100,000 steps, here 4) refused long runs' resumes.
    limit, base_module.MAX_SCHEDULE_ADVANCE = base_module.MAX_SCHEDULE_ADVANCE, 4
    try:
        resumed = _train(run, _momentum_sgd, _cosine, **settings, resume=True)
    finally:
        base_module.MAX_SCHEDULE_ADVANCE = limit
    # hogwild-easgd: a resumed worker's first step takes the schedule at the resumed step
    run = base / "hogwild-easgd"
    hogwild = {"method": "hogwild-easgd", "steps": 12, "checkpoint_every": 4, "eval_every": 12}
    _train(run, None, _cosine, **hogwild)
    dist.barrier()
    hogwild_resumed = _train(run, None, _cosine, **hogwild, resume=True)
    # hogwild-sgd, momentum SGD: each worker's own velocity (the method's state, loaded after
    # it, held the server's empty optimizer and went over it)
    run = base / "hogwild-sgd"
    hogwild = {"method": "hogwild-sgd", "steps": 12, "checkpoint_every": 4, "eval_every": 12}
    _train(run, _momentum_sgd, **hogwild)
    hogwild_saved = torch.load(shard_path(run, rank), weights_only=True) if rank else None
    dist.barrier()
    hogwild_sgd = _train(run, _momentum_sgd, **hogwild, resume=True)
    if rank:
        out["hogwild-sgd"] = {
            "saved": hogwild_saved,
            "resumed": hogwild_sgd.method.optimizer_state(),
        }
        schedule = hogwild_resumed.method.scheduler
        out["hogwild-schedule"] = schedule.last_epoch  # type: ignore[union-attr]
        out["async-easgd-momentum"] = {
            "saved": saved,
            "resumed": resumed.method.optimizer_state(),
            "schedule": resumed.method.scheduler.last_epoch,  # type: ignore[union-attr]
        }
    return out


def _flat(state: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([t.reshape(-1).float() for t in state.values()]).numpy()


def _saved(run: Path) -> np.ndarray:
    return _flat(torch.load(run / "model.pt", weights_only=True))


def _final_metrics(run: Path) -> dict[str, float]:
    return json.loads((run / "summary.json").read_text())["final_metrics"]


def _summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def _check_whole_run(whole: dict[str, Any], resumed: dict[str, Any], workers: int) -> None:
    """The resumed run's summary counts the whole run: the same rounds as the uninterrupted
    run, every step's samples over the whole training time."""
    assert resumed["rounds"] == whole["rounds"] > 0, (whole["rounds"], resumed["rounds"])
    samples = STEPS * 8 * workers
    assert resumed["samples_per_s"] * resumed["training_time_s"] == pytest.approx(samples)
    assert resumed["comm_fraction"] > 0 and resumed["time_split_s"]["compute"] > 0


def test_shards_resume_bitwise_and_a_finished_async_run_resumes_its_center(
    four_ranks: tuple[list[dict[str, Any]], Path],
) -> None:
    ranks, root = four_ranks
    assert len(ranks) == WORLD
    assert all(rank["shard-resume"]["files-then-start"] == ["files", "start"] for rank in ranks)
    results, tmp_path = ranks[0]["shard-resume"], root / "shard-resume"
    for method in REPLICATED:
        res = results[method]
        assert res["checkpoint_step"] == 20, (method, res["checkpoint_step"])
        assert res["shards"] == [f"rank-{r}.pt" for r in range(WORLD)], method
        assert res["steps"] == [20] * WORLD, method
        # the replicas differ at the checkpoint (rank 2 is on the other node in two-level)
        assert not np.array_equal(res["replicas"][0], res["replicas"][2]), method
        whole, resumed = tmp_path / method / "whole", tmp_path / method / "interrupted"
        assert np.array_equal(_saved(whole), _saved(resumed)), method
        assert _final_metrics(whole) == _final_metrics(resumed), method
        history = json.loads((resumed / "summary.json").read_text())["history"]
        assert [h["step"] for h in history] == [STOP, STEPS], (method, history)
        _check_whole_run(*res["summaries"], workers=WORLD)
    # sync-easgd: the model evaluated and saved is the center; 30 steps, a round every 3,
    # alpha = 0.9 / 4 workers
    whole = tmp_path / "sync-easgd" / "whole"
    assert np.array_equal(_saved(whole), results["sync-easgd-center"])
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["rounds"] == STEPS // TAU and summary["tau"] == TAU
    assert summary["alpha"] == 0.9 / WORLD
    assert summary["final_metrics"]["accuracy"] > 0.5, summary["final_metrics"]  # chance: 1/3
    served = results["original-easgd"]
    assert served["checkpoint_step"] == 21  # a round's end: 7 rounds of tau 3
    assert served["shards"] == [f"rank-{r}.pt" for r in range(1, WORLD)]
    assert served["steps"] == [21] * (WORLD - 1)
    # each worker's replica is its own, neither the center nor another worker's
    assert not np.array_equal(served["replicas"][0], served["replicas"][1])
    assert not np.array_equal(served["replicas"][0], served["center"])
    whole, resumed = (
        tmp_path / "original-easgd" / "whole",
        tmp_path / "original-easgd" / "interrupted",
    )
    assert np.array_equal(_saved(whole), _saved(resumed))
    assert _final_metrics(whole) == _final_metrics(resumed)
    assert "warning" not in served["resume_stderr"], served["resume_stderr"]
    _check_whole_run(*served["summaries"], workers=WORLD - 1)
    mid_round = results["original-easgd-mid-round"]
    assert mid_round["step"] == 9, mid_round
    assert "warning" not in mid_round["resume_stderr"], mid_round["resume_stderr"]
    checkpoint = results["async-easgd"]
    assert checkpoint["server_busy_s"] > 0
    assert checkpoint["step"] == 10  # the run's last step, not a multiple of 4
    assert checkpoint["shards"] == [10] * (WORLD - 1)  # each worker's optimizer at its last
    assert np.array_equal(_saved(tmp_path / "async-easgd"), checkpoint["center"])
    assert checkpoint["finished"]["rounds"] == 3 * 10  # 3 workers, tau 1
    assert checkpoint["kept"] == checkpoint["finished"]
    pushed = results["async-sgd"]
    saved, summary = pushed["saved"], pushed["summary"]
    # where its target stopped it (not at 5): its global step, which counts the pushes
    # answered with the stop too, unapplied; the resumed run goes on from there
    assert saved["step"] == pushed["stopped"]["steps"] >= 8
    assert saved["method"]["updates"] == 3 * 8
    assert summary["rounds"] == 3 * 8 + 3 * (12 - saved["step"])
    assert summary["stale_gradients_dropped"] >= saved["method"]["dropped"] >= 2
    for rank in range(1, WORLD):  # every worker its own save, back in its optimizer
        own = ranks[rank]["shard-resume"]["async-easgd-momentum"]
        saved, resumed = own["saved"]["optimizer_only"], own["resumed"]
        assert saved["scaler"]["scale"] > 65536.0, saved["scaler"]  # grown: not a fresh one
        assert resumed["scaler"] == saved["scaler"], rank
        assert own["schedule"] == 12, own["schedule"]  # the checkpoint's step
        assert ranks[rank]["shard-resume"]["hogwild-schedule"] == 12, rank
        _check_velocities(saved["optimizer"], resumed["optimizer"], rank)
        hogwild = ranks[rank]["shard-resume"]["hogwild-sgd"]
        saved_optimizer = hogwild["saved"]["optimizer_only"]["optimizer"]
        _check_velocities(saved_optimizer, hogwild["resumed"]["optimizer"], rank)


def _check_velocities(saved: dict[str, Any], resumed: dict[str, Any], rank: int) -> None:
    """The resumed optimizer holds the saved velocities, which are not a fresh optimizer's."""
    velocities = [s["momentum_buffer"] for s in saved["state"].values()]
    assert velocities and any(np.abs(v).sum() > 0 for v in velocities), rank
    for key, value in saved["state"].items():
        resumed_velocity = resumed["state"][key]["momentum_buffer"]
        assert np.array_equal(resumed_velocity, value["momentum_buffer"]), (rank, key)
