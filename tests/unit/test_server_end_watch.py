"""A parameter-server worker with no supervisor ends its own process once the server has closed
its connections and its loop is still not done (tether.methods.server_end_watch)."""

from __future__ import annotations

import threading
import time

import pytest

from tether.methods import server_end_watch
from tether.methods.server_end_watch import ServerEndWatch, supervised
from tether.observe.joined import JOINED_MARK_ENV


class _Leave:
    def __init__(self) -> None:
        self.status: int | None = None
        self.called = threading.Event()

    def __call__(self, status: int) -> None:
        self.status = status
        self.called.set()


@pytest.fixture(autouse=True)
def _fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_end_watch, "POLL_S", 0.02)


def test_a_hung_worker_leaves_with_status_0_after_the_grace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    closed = threading.Event()
    leave = _Leave()
    watch = ServerEndWatch(closed.is_set, rank=2, grace_s=0.3, leave=leave)
    time.sleep(0.2)
    assert not leave.called.is_set()  # the server still serves: nothing happens
    closed.set()
    started = time.monotonic()
    assert leave.called.wait(5)
    assert time.monotonic() - started >= 0.3  # not before the grace
    assert leave.status == 0  # the run went on without it: no failure for its launcher
    assert "worker rank 2: the parameter server has closed its connections" in (
        capsys.readouterr().err
    )
    watch.stop()


def test_a_worker_that_says_goodbye_in_the_grace_is_left_alone() -> None:
    closed = threading.Event()
    leave = _Leave()
    watch = ServerEndWatch(closed.is_set, rank=1, grace_s=0.5, leave=leave)
    closed.set()
    time.sleep(0.1)
    watch.stop()  # its goodbye, after the server's last reply
    assert not leave.called.wait(0.8)


def test_a_watch_stopped_before_the_server_ends_never_fires() -> None:
    leave = _Leave()
    watch = ServerEndWatch(lambda: False, rank=1, grace_s=0.0, leave=leave)
    watch.stop()
    assert not leave.called.wait(0.2)


def test_only_a_process_without_a_supervisor_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JOINED_MARK_ENV, raising=False)
    assert not supervised()  # torchrun, mpiexec
    monkeypatch.setenv(JOINED_MARK_ENV, "/tmp/marks/joined-rank-1")
    assert supervised()  # tether launch, tether.fit: the supervisor ends a given-up worker


def test_a_process_already_exiting_keeps_its_own_status(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker that failed is on its way out (its main thread done, exit handlers running):
    # leaving with 0 there would hide its failure from its launcher.
    class _Ended:
        def is_alive(self) -> bool:
            return False

    monkeypatch.setattr(server_end_watch.threading, "main_thread", _Ended)
    leave = _Leave()
    ServerEndWatch(lambda: True, rank=1, grace_s=0.05, leave=leave)
    assert not leave.called.wait(0.5)
