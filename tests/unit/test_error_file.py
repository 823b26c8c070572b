"""The worker's structured error for the elastic agent (tether.launch.error_file): whole or absent,
in the format torch's agent reads."""

from __future__ import annotations

import sys

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

import tether.launch.error_file as error_file
import tether.observe.files as files
from tether.errors import TetherError
from tether.launch.error_file import read_error_file, record_errors, record_uncaught_errors
from tether.launch.failure_report import describe_failures


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


def _uncaught(exc: BaseException) -> None:
    """What the interpreter does with an exception that ends the script."""
    try:
        raise exc
    except BaseException as raised:
        sys.excepthook(type(raised), raised, raised.__traceback__)


def test_a_users_script_leaves_its_uncaught_error_for_the_launcher(monkeypatch, tmp_path) -> None:
    # A user's own script under tether launch or torchrun (tether.init installs the hook): its
    # exception used to reach the launcher's report as "exited with code 1" only.
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.delenv("TETHER_LAUNCH_REPORTS", raising=False)  # torchrun's case
    monkeypatch.setattr(error_file, "_hooked", False)
    printed: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, exc, tb: printed.append(exc))
    record_uncaught_errors()
    record_uncaught_errors()  # once per process: a second init adds no second hook
    _uncaught(KeyboardInterrupt())
    assert not path.exists()  # an interrupt is the launcher's to report
    _uncaught(TetherError("the server rank trains on no data: call ctx.sampler after ctx.wrap"))
    ours = read_error_file(str(path))
    assert ours["message"] == (
        "TetherError: the server rank trains on no data: call ctx.sampler after ctx.wrap"
    )
    assert "_uncaught" in ours["traceback"]
    assert len(printed) == 2  # the traceback is still printed, by the hook before ours
    failure = ProcessFailure(local_rank=0, pid=123, exitcode=1, error_file=str(path))
    # the launcher's report: rank 0 of a parameter-server method is the server, with its reason
    message, ranks = describe_failures(
        ChildFailedError("script", {0: failure, 1: ProcessFailure(1, 124, -15, "")}),
        None,
        servers=1,
    )
    assert message == (
        "server rank 0 failed: TetherError: the server rank trains on no data: call ctx.sampler "
        "after ctx.wrap; worker rank 1 failed: killed by SIGTERM"
    )
    assert ranks == [0, 1]


def test_under_tether_launch_a_one_line_error_is_not_printed_per_rank(
    monkeypatch, tmp_path
) -> None:
    # tether launch reports every failed rank's error in one line; each rank printing its
    # traceback of a one-line error (a bad option to tether.init) too buried that line.
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setenv("TETHER_LAUNCH_REPORTS", "1")
    monkeypatch.setattr(error_file, "_hooked", False)
    printed: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, exc, tb: printed.append(exc))
    record_uncaught_errors()
    _uncaught(TetherError("tau must be >= 1, got -3"))
    assert printed == []
    assert read_error_file(str(path))["message"] == "TetherError: tau must be >= 1, got -3"
    _uncaught(ValueError("shapes (4,3) and (2,2) do not align"))  # a bug: its traceback helps
    assert [str(e) for e in printed] == ["shapes (4,3) and (2,2) do not align"]
    assert read_error_file(str(path))["message"].startswith("ValueError: shapes")


def test_outside_an_agent_no_hook_is_installed(monkeypatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setattr(error_file, "_hooked", False)
    before = sys.excepthook
    record_uncaught_errors()
    assert sys.excepthook is before
