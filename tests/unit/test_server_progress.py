"""A server's evaluation keeps its waiting workers: told between batches that it is busy, and a
batch that takes near --timeout (which that cannot cover) is said once."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import tether.observe.files as files
import tether.training.server_progress as server_progress
from tether.methods.flat import flatten_parameters
from tether.observe.files import ReportingWriter, atomic_write
from tether.training.checkpoint import save_checkpoint
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


def test_a_save_that_progresses_keeps_the_workers_waiting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A server's checkpoint that took longer than --timeout lost its waiting workers: they
    # heard from it only before and after the save. Now every write that reaches the file may
    # reassure them, at most 4 times per --timeout, and a save whose writes stop says nothing.
    now = [0.0]
    monkeypatch.setattr(server_progress, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    told: list[float] = []
    waiting = WaitingWorkers(lambda: told.append(now[0]), timeout_s=2.0)

    def slow_save(handle: Any) -> None:  # 10 chunks, 0.3 s apart: 3 s, past the timeout
        for _ in range(10):
            now[0] += 0.3
            handle.write(b"x" * 1000)

    atomic_write(tmp_path / "checkpoint.pt", slow_save, waiting.progress)
    assert (tmp_path / "checkpoint.pt").stat().st_size == 10_000
    gaps = [b - a for a, b in zip([0.0, *told], [*told, now[0]], strict=True)]
    assert len(told) == 5 and max(gaps) <= 0.6 + 1e-9, told  # every 0.5 s or so, not per write
    told.clear()
    now[0] += 10.0  # a save whose writes stopped: nothing reassures anyone
    assert told == []


def test_a_long_save_goes_to_the_disk_as_it_goes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The save's writes land in the page cache; its one sync at the end took the whole file to
    # the disk in one silent call, which on a slow file system outlasted --timeout. Now every
    # sync_every bytes are synced as they go, each followed by a report.
    events: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(("fsync", os.fstat(fd).st_size))

    monkeypatch.setattr(os, "fsync", fsync)
    with open(tmp_path / "save", "wb") as handle:
        writer = ReportingWriter(handle, lambda: events.append(("progress", 0)), sync_every=2500)
        for _ in range(6):
            writer.write(b"x" * 1000)
    synced = [size for what, size in events if what == "fsync"]
    assert synced == [3000, 6000]  # the bytes on the disk at each sync: at most 2999 left over
    assert events[2:4] == [("fsync", 3000), ("progress", 0)]  # the sync, then its report
    assert [what for what, _ in events].count("progress") == 6
    # One large write (torch.save writes a model whose parameters share one flat storage, as a
    # parameter server's do, in a single call) goes in pieces: it was one silent sync.
    events.clear()
    monkeypatch.setattr(files, "SYNC_EVERY_BYTES", 1 << 20)
    model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 1000))
    flatten_parameters(model)  # 8 MB in one storage
    state = model.state_dict()
    atomic_write(tmp_path / "flat.pt", lambda handle: torch.save(state, handle), lambda: None)
    synced = [size for what, size in events if what == "fsync"]
    assert len(synced) >= 8 and all(b - a <= 1 << 20 for a, b in itertools.pairwise(synced))
    loaded = torch.load(tmp_path / "flat.pt", weights_only=True)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_a_checkpoint_saved_with_progress_is_the_same_file(tmp_path: Path) -> None:
    calls = []
    state = {"w": torch.arange(3_000_000, dtype=torch.float32), "step": 7}
    save_checkpoint(tmp_path, state, lambda: calls.append(1))
    assert len(calls) > 1  # torch.save writes a 12 MB tensor in many chunks
    loaded = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7
