"""A server's evaluations: one that takes near --timeout is said once, where workers wait."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import tether.training.server_progress as server_progress
from tether.config import TrainConfig
from tether.observe.metrics import MetricsLog
from tether.training.run_record import RunRecord
from tether.training.server_progress import ServerProgress


@pytest.mark.parametrize("workers_wait", [True, False])
def test_an_evaluation_near_the_timeout_is_said_once(
    workers_wait: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An async run with --timeout 3 lost every worker while its server evaluated for longer
    on a busy machine, with no word on why; Hogwild's workers do not wait, so nothing there."""
    now = [0.0]
    monkeypatch.setattr(server_progress, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def evaluate(step: int, final: bool) -> dict[str, float]:
        now[0] += 2.0  # seconds: over half of --timeout 3
        return {"loss": 1.0}

    progress = ServerProgress(
        TrainConfig(timeout_s=3.0, progress=False),
        RunRecord(),
        100,
        10,
        MetricsLog(None),
        None,
        evaluate,
        lambda step: None,
        lambda: now[0],
        lambda: torch.zeros(3),
        workers_wait,
    )
    progress.evaluate(10)
    said = capsys.readouterr().err
    assert ("evaluation took 2.0 s, near --timeout 3 s" in said) is workers_wait
    progress.evaluate(20)
    assert "warning" not in capsys.readouterr().err  # once
    progress.close()
