"""A resume's own optimizer and schedule factories against the checkpoint's state, checked before
any worker starts (tether.training.resumed_state): left out or replaced, they built another
optimizer than the checkpoint's (a worker failed on its state: KeyError: 'momentum'), dropped the
run's schedule without a word, or took another rate that torch silently put back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tether.config import TrainConfig
from tether.errors import TetherError
from tether.optim import NamedSchedule, ScheduleSettings
from tether.optim.schedules import build_scheduler
from tether.training.checkpoint import SHARDS_DIR
from tether.training.resumed_state import check_resumed_state
from tether.training.task import Task

MODEL = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-3)


def adamw_faster(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2)


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def cosine(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=50)


def steps(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=5)


def _task(optimizer: Any = None, scheduler: Any = None) -> Task:
    data = TensorDataset(torch.randn(64, 4), torch.zeros(64, dtype=torch.long))
    loss = nn.CrossEntropyLoss()
    return Task(MODEL, data, loss, optimizer=optimizer, scheduler=scheduler)


def _saved_by(optimizer: Any, scheduler: Any = None) -> dict[str, Any]:
    """checkpoint.pt's method state as a run with these factories leaves it, a few steps in."""
    built = optimizer(MODEL.parameters())
    schedule = scheduler(built) if scheduler is not None else None
    for _ in range(3):
        built.step()
        if schedule is not None:
            schedule.step()
    method = {"optimizer": built.state_dict()}
    if schedule is not None:
        method["scheduler"] = schedule.state_dict()
    return {"method": method}


def _check(tmp_path: Path, state: dict[str, Any], task: Task, method: str = "sync-sgd") -> None:
    check_resumed_state(tmp_path, state, TrainConfig(method=method), task, MODEL)


def test_the_runs_own_factories_pass(tmp_path: Path) -> None:
    _check(tmp_path, _saved_by(adamw, cosine), _task(adamw, cosine))
    _check(tmp_path, _saved_by(adamw), _task(adamw))


@pytest.mark.parametrize(
    ("task", "said"),
    [
        (_task(), r"another optimizer \(with amsgrad, betas, eps\) than .* \(with dampening, "),
        (_task(sgd, cosine), r"another optimizer \(with amsgrad, betas, eps\)"),
        (_task(adamw_faster, cosine), r"of lr 0\.01: the run's has lr 0\.003"),
        (_task(adamw), r"without a learning-rate schedule: the run had one"),
        (_task(adamw, steps), r"with StepLR: the run's schedule was another kind \(with T_max"),
    ],
    ids=["left-out", "another-kind", "another-rate", "schedule-dropped", "another-schedule"],
)
def test_a_resume_that_builds_another_optimizer_or_schedule_is_one_line(
    tmp_path: Path, task: Task, said: str
) -> None:
    with pytest.raises(TetherError, match=f"cannot resume {tmp_path}.*{said}"):
        _check(tmp_path, _saved_by(adamw, cosine), task)


def test_a_methods_default_warm_up_in_epochs_passes(tmp_path: Path) -> None:
    """sync-sgd's default rate warms up over half an epoch: built at a length of one-step
    epochs, the check found no schedule and refused every default resume of the method."""
    warm = NamedSchedule("constant", ScheduleSettings(warmup_epochs=0.5))
    task = _task(scheduler=warm)  # 64 samples: 8 steps an epoch of 2 workers x 4
    config = TrainConfig(method="sync-sgd", workers=2, batch_size=4, steps=20)
    run = torch.optim.SGD(MODEL.parameters(), lr=0.1)
    schedule = build_scheduler(warm, run, 20, 8)
    assert schedule is not None  # the run had one: a warm-up of 4 steps
    saved = {"method": {"optimizer": run.state_dict(), "scheduler": schedule.state_dict()}}
    check_resumed_state(tmp_path, saved, config, task, MODEL)


def test_a_schedule_the_run_did_not_have_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TetherError, match="with a learning-rate schedule: the run had none"):
        _check(tmp_path, _saved_by(adamw), _task(adamw, cosine))


def test_a_servers_run_is_checked_against_a_workers_own_state(tmp_path: Path) -> None:
    # async-easgd's checkpoint.pt holds the center's counters; each worker keeps its optimizer
    (tmp_path / SHARDS_DIR).mkdir()
    own = {"step": 10, "optimizer_only": {"optimizer": adamw(MODEL.parameters()).state_dict()}}
    torch.save(own, tmp_path / SHARDS_DIR / "rank-1.pt")
    state = {"method": {"updates": 30}}
    _check(tmp_path, state, _task(adamw), method="async-easgd")
    with pytest.raises(TetherError, match="another optimizer"):
        _check(tmp_path, state, _task(sgd), method="async-easgd")


def test_an_asynchronous_workers_schedule_is_checked_by_its_kind(tmp_path: Path) -> None:
    # Its position is the global step's, so it was not kept, and a resume of async-easgd
    # without the run's schedule trained at a constant rate without a word.
    (tmp_path / SHARDS_DIR).mkdir()
    run = adamw(MODEL.parameters())
    own = {"optimizer": run.state_dict(), "scheduler": cosine(run).state_dict()}
    torch.save({"step": 10, "optimizer_only": own}, tmp_path / SHARDS_DIR / "rank-1.pt")
    state = {"method": {"updates": 30}}
    _check(tmp_path, state, _task(adamw, cosine), method="async-easgd")
    with pytest.raises(TetherError, match="without a learning-rate schedule: the run had one"):
        _check(tmp_path, state, _task(adamw), method="async-easgd")
    with pytest.raises(TetherError, match="with StepLR: the run's schedule was another kind"):
        _check(tmp_path, state, _task(adamw, steps), method="async-easgd")


def build_model() -> nn.Module:
    return MODEL


def test_fit_refuses_it_before_any_worker_starts(tmp_path: Path) -> None:
    """What tether.fit(resume=True) did with the run's AdamW left out: workers failed with
    KeyError: 'momentum' on the checkpoint's state."""
    import tether

    run = tmp_path / "run"
    run.mkdir()
    settings = {"method": "sync-sgd", "model": "build_model", "dataset": "TensorDataset"}
    config = TrainConfig(**settings, workers=2, batch_size=4, steps=20, out=str(run))
    (run / "config.toml").write_text(config.to_toml())
    saved = _saved_by(adamw, cosine)
    checkpoint = {"step": 10, "model": MODEL.state_dict(), "history": [], "elapsed_s": 1.0}
    checkpoint |= {"time_to_target_s": None, "method_name": "sync-sgd"}
    torch.save(checkpoint | saved | {"model_name": "build_model"}, run / "checkpoint.pt")
    data = _task().train_data
    with pytest.raises(TetherError, match="another optimizer"):
        tether.fit(build_model, data, loss=nn.CrossEntropyLoss(), out=run, resume=True, steps=30)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.toml"]
