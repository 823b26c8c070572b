"""A server whose evaluation takes longer than --timeout keeps its workers: they wait for their
replies while it evaluates, and it tells them between batches that it is busy."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import tether
from tether.errors import WorkerFailure

TIMEOUT_S = 3.0
DELAY_S = 0.1  # per evaluation sample: 48 samples take 4.8 s, past the timeout


class SlowEval(Dataset):
    """An evaluation set whose samples are slow to load (a remote or decoded data set)."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(48, 6, generator=gen)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(DELAY_S)
        return self.x[i], self.y[i]


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))


class Big(nn.Module):
    """64 MB of parameters: a worker's message is larger than the socket buffers (here up to
    about 36 MB), so it cannot be written until the server reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = net()
        self.big = nn.Parameter(torch.zeros(16_000_000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) + 0 * self.big[:1]


def _train_data() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 6, generator=gen)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _fit_evaluating_slowly(
    model: Callable[[], nn.Module], method: str, steps: int, tmp_path: Path
) -> dict:
    """2 workers, --timeout 3, two evaluations of 4.8 s (one while the workers train, one at
    the end) in batches of 0.8 s, between which the server speaks; the run's summary."""
    result = tether.fit(
        model=model,
        train_data=_train_data(),
        eval_data=SlowEval(),
        loss=nn.CrossEntropyLoss(),
        method=method,
        workers=2,
        steps=steps,
        batch_size=16,
        eval_every=steps // 2,
        eval_batch_size=8,
        timeout_s=TIMEOUT_S,
        out=tmp_path / "run",
        progress=False,
    )
    return result.summary


def test_an_evaluation_longer_than_the_timeout_loses_no_worker(tmp_path: Path) -> None:
    """Before, each worker gave the evaluating server up after --timeout ("rank 0 sent nothing
    for 3.0 s") and the run failed with every worker lost."""
    summary = _fit_evaluating_slowly(net, "async-easgd", 40, tmp_path)
    assert summary["lost_workers"] == []
    assert summary["steps"] == 40
    assert [entry["step"] for entry in summary["history"]] == [20, 40]
    assert summary["final_test_accuracy"] > 0.6  # one feature decides the class: chance is 0.5


@pytest.mark.slow  # 64 MB messages: about 20 s
def test_round_robin_takes_in_a_large_message_while_it_evaluates(tmp_path: Path) -> None:
    """original-easgd reads a worker's message only in its turn: during an evaluation longer
    than --timeout a worker whose message did not fit the socket buffers timed out in its send
    ("read nothing for 3.0 s (8709239 of 64000296 bytes of a message)") and the run failed;
    the BUSY messages could not reach it. The server now takes such a message in between
    evaluation batches and serves it in its turn."""
    summary = _fit_evaluating_slowly(Big, "original-easgd", 12, tmp_path)
    assert summary["lost_workers"] == []
    assert summary["steps"] == 12


class StuckEval(SlowEval):
    """An evaluation set whose reads past the first sample (which the server reads at its
    start, to choose the metrics) never return: a stuck mount, a deadlocked loader."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i > 0:
            time.sleep(10**6)
        return self.x[i], self.y[i]


@pytest.mark.parametrize("method", ["async-sgd", "original-easgd"])  # tolerant or not of a loss
def test_a_server_hung_after_its_workers_finished_is_ended_naming_it(
    tmp_path: Path, method: str
) -> None:
    """Every worker finished, the server hung in its final evaluation, and nobody watched it:
    the run waited for it for ever. Its supervisor now gives it up once its pulse has stood
    still for --timeout after the last worker finished, and the run fails naming it."""
    started = time.monotonic()
    with pytest.raises(WorkerFailure) as failure:
        tether.fit(
            model=net,
            train_data=_train_data(),
            eval_data=StuckEval(),  # read only at the end: no evaluation before the last step
            loss=nn.CrossEntropyLoss(),
            method=method,
            workers=2,
            steps=10,
            batch_size=16,
            eval_every=1000,
            timeout_s=TIMEOUT_S,
            out=tmp_path / "run",
            progress=False,
        )
    message = str(failure.value)
    assert message.startswith("server rank 0"), message
    assert "after every worker had finished" in message, message
    assert time.monotonic() - started < 40  # start-up, 10 steps, then --timeout 3 s
    assert failure.value.ranks == [0]
