"""A server's evaluation keeps its waiting workers: told between batches that it is busy, and a
batch that takes near --timeout (which that cannot cover) is said once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import tether.training.server_progress as server_progress
from tether.training.server_progress import WaitingWorkers


def test_each_batch_keeps_the_workers_waiting_and_a_slow_batch_is_said_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    now = [0.0]
    monkeypatch.setattr(server_progress, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    told = []
    waiting = WaitingWorkers(lambda: told.append(now[0]), timeout_s=3.0)

    def evaluation(batch_seconds: list[float]) -> None:
        waiting.start()
        for seconds in batch_seconds:
            now[0] += seconds  # loading the batch, before the evaluation takes it
            waiting.tick()
        now[0] += 0.1  # the last batch's forward
        waiting.end()

    evaluation([0.5] * 10)  # 5 s in all, every gap far below --timeout: nothing to say
    assert len(told) == 10
    assert waiting.longest_s == pytest.approx(0.5)
    assert capsys.readouterr().err == ""
    evaluation([0.5, 2.0, 0.5])  # one batch over half of --timeout
    assert len(told) == 13
    assert "an evaluation batch took 2.0 s, near --timeout 3 s" in capsys.readouterr().err
    evaluation([2.5])
    assert capsys.readouterr().err == ""  # once
