"""Worker exit statuses and launcher stops (tether.launch.exits), as the launchers rely on them."""

from __future__ import annotations

import signal

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException

import tether.launch.exits as exits
from tether.errors import TetherError, WorkerFailure
from tether.launch.exits import stopped, worker_exit_status


def _interrupted_status(monkeypatch: pytest.MonkeyPatch) -> int:
    """The status an interrupted worker ends with: it leaves through os._exit (no teardown),
    replaced here by an exception so that the test process survives."""

    def fake_exit(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(exits.os, "_exit", fake_exit)
    with pytest.raises(SystemExit) as leaving:
        worker_exit_status(_raise(KeyboardInterrupt()))
    return int(leaving.value.code)  # type: ignore[arg-type]


def _raise(exc: BaseException):
    def body() -> None:
        raise exc

    return body


def test_statuses_outside_an_elastic_agent(monkeypatch, capsys) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert worker_exit_status(lambda: None) == 0
    assert _interrupted_status(monkeypatch) == 130
    assert worker_exit_status(_raise(TetherError("bad --sizes"))) == 2
    assert capsys.readouterr().err == "tether: error: bad --sizes\n"  # one line, no traceback
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        worker_exit_status(_raise(ZeroDivisionError()))


def test_statuses_under_an_elastic_agent(monkeypatch, capsys, tmp_path) -> None:
    # @record writes the error for the agent, whose launcher reports it: the worker stays quiet.
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    assert worker_exit_status(_raise(TetherError("bad --sizes"))) == 1
    assert worker_exit_status(_raise(ZeroDivisionError())) == 1
    assert _interrupted_status(monkeypatch) == 130
    assert capsys.readouterr().err == ""


def test_a_stop_is_reraised_as_what_the_cli_reports() -> None:
    interrupt = stopped(SignalException("stop", signal.SIGINT))
    assert isinstance(interrupt, KeyboardInterrupt)
    failure = stopped(SignalException("stop", signal.SIGTERM))
    assert isinstance(failure, WorkerFailure)
    assert str(failure) == "stopped by SIGTERM; the workers were stopped"
