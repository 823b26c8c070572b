"""The worker's structured error for the elastic agent (tether.launch.error_file): whole or absent,
in the format torch's agent reads."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

import tether.observe.files as files
from tether.launch.error_file import read_error_file, record_errors


class _Killed(BaseException):
    """Stands for the SIGKILL the agent sends a rank while it is writing its error."""


@record_errors
def _failing_worker() -> None:
    raise ValueError("rank 1: all_reduce timed out")


def test_the_agent_reads_what_a_failing_worker_wrote(monkeypatch, tmp_path) -> None:
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    with pytest.raises(ValueError):
        _failing_worker()
    failure = ProcessFailure(local_rank=1, pid=123, exitcode=1, error_file=str(path))
    assert failure.message["message"] == "ValueError: rank 1: all_reduce timed out"
    assert failure.timestamp > 0  # read from the file, as torch's own writer leaves it
    ours = read_error_file(str(path))
    assert ours["message"] == "ValueError: rank 1: all_reduce timed out"
    assert "_failing_worker" in ours["traceback"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error.json"]  # no temporary left


def test_a_worker_killed_while_writing_leaves_no_partial_file(monkeypatch, tmp_path) -> None:
    # torch's @record opens the error file in place and json.dump's into it: killed between the
    # two, the agent found an empty file and stopped on its own JSONDecodeError instead of
    # reporting the failure. Killed at the last moment before the rename, ours leaves none.
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    written: list[int] = []

    def killed_after_writing(fd: int) -> None:
        written.append(fd)
        raise _Killed()

    monkeypatch.setattr(files.os, "fsync", killed_after_writing)
    with pytest.raises(_Killed):
        _failing_worker()
    assert written, "the error was never written: the kill was not simulated"
    assert not path.exists()
    failure = ProcessFailure(local_rank=1, pid=123, exitcode=-9, error_file=str(path))
    assert failure.message.startswith("Signal 9")  # the agent reports the kill itself


def test_outside_an_agent_nothing_is_written(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError):
        _failing_worker()
    assert list(tmp_path.iterdir()) == []
    assert read_error_file(None) == {}
    assert read_error_file(str(tmp_path / "missing.json")) == {}
