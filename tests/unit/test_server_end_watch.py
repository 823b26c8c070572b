"""A parameter-server worker with no supervisor, given up and left behind by the server, ends its
own process (tether.methods.server_end_watch): only after the server's END, only outside
Tether's own exchanges, and never once it said goodbye."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from tether.comm.socket_wire import SocketWire, WireConnection
from tether.methods import server_end_watch
from tether.methods.ps_server import WATCH_CHANNEL, ServerEndpoint
from tether.methods.ps_worker import WorkerEndpoint
from tether.methods.server_end_watch import (
    ServerEndWatch,
    own_failure_wanted,
    say_given_up,
    supervised,
    watch_wanted,
)
from tether.observe.joined import JOINED_MARK_ENV


class _Leave:
    def __init__(self) -> None:
        self.status: int | None = None
        self.called = threading.Event()

    def __call__(self, status: int) -> None:
        self.status = status
        self.called.set()


class _Link:
    """A worker's link as the watch sees it; ``end`` is what the server sent."""

    def __init__(self) -> None:
        self.in_exchange = 0
        self.failed = False
        self.spoke = threading.Event()
        self.end = True  # the server's END (False: the bare end of the connection)

    def server_spoke(self) -> bool:
        return self.spoke.is_set()

    def told_given_up(self) -> bool:
        return self.end


@pytest.fixture(autouse=True)
def _fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_end_watch, "POLL_S", 0.02)


def _watch(link: _Link, grace_s: float, alive: bool = True) -> tuple[ServerEndWatch, _Leave]:
    leave = _Leave()
    watch = ServerEndWatch(link, rank=2, grace_s=grace_s, leave=leave, main_alive=lambda: alive)
    return watch, leave


def test_a_worker_given_up_and_stuck_in_its_loop_leaves_with_status_0_after_the_grace(
    capfd: pytest.CaptureFixture[str],
) -> None:
    link = _Link()
    watch, leave = _watch(link, grace_s=0.3)
    time.sleep(0.2)
    assert not leave.called.is_set()  # the server still serves: nothing happens
    started = time.monotonic()
    link.spoke.set()
    assert leave.called.wait(5)
    assert time.monotonic() - started >= 0.3  # not before the grace
    assert leave.status == 0  # the run went on without it: no failure for its launcher
    assert "worker rank 2: the parameter server gave this worker up" in capfd.readouterr().err
    watch.stop()


@pytest.mark.parametrize(
    "state",
    ["goodbye in the grace", "bare end", "in an exchange", "an exchange failed", "exiting"],
)
def test_a_worker_the_watch_leaves_alone(state: str) -> None:
    link = _Link()
    link.end = state != "bare end"  # the server failed, or this process closed the connection
    link.in_exchange = int(state == "in an exchange")  # ends by its own timeout, and says why
    link.failed = state == "an exchange failed"  # the loop knows its link is broken
    watch, leave = _watch(link, grace_s=0.5, alive=state != "exiting")
    link.spoke.set()
    if state == "goodbye in the grace":
        time.sleep(0.2)
        watch.stop()
    watch._thread.join(10)  # the watch ends on its own once it has decided
    assert not watch._thread.is_alive() and not leave.called.is_set()


def test_a_watch_stopped_before_the_server_ends_never_fires() -> None:
    link = _Link()
    watch, leave = _watch(link, grace_s=0.0)
    watch.stop()
    link.spoke.set()
    assert not leave.called.wait(0.3)


def _wires(workers: int = 1) -> tuple[SocketWire, list[SocketWire]]:
    """A server (rank 0) and its workers (ranks 1..) joined on the liveness channel alone."""
    mine, theirs = {}, []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        for rank in range(1, workers + 1):
            a = socket.create_connection(listener.getsockname()[:2])
            b, _ = listener.accept()
            mine[rank, WATCH_CHANNEL] = WireConnection(b, rank, WATCH_CHANNEL)
            connection = {(0, WATCH_CHANNEL): WireConnection(a, 0, WATCH_CHANNEL)}
            theirs.append(SocketWire(rank, workers + 1, connection, 5.0))
    return SocketWire(0, workers + 1, mine, 5.0), theirs


def _spoken(link: WorkerEndpoint) -> bool:
    deadline = time.monotonic() + 5
    while not link.server_spoke() and time.monotonic() < deadline:
        time.sleep(0.01)
    return link.server_spoke()


def test_the_server_tells_only_the_workers_it_gave_up_as_silent() -> None:
    # One given up as a broken peer (its step jumped) and one as silent: only the silent one
    # hears the END; the broken one, whose process may go on (a test, a caught error), only
    # sees its connection end.
    server_wire, (broken_wire, silent_wire) = _wires(2)
    server = ServerEndpoint(server_wire, torch.zeros(3), silence_timeout_s=1.0)
    server.give_up(1, "protocol: its step went from 0 to 1000000 (a broken peer)")
    server.give_up_silent(2, "sent nothing for 9 s after the server's reply (hung?)")
    server.give_up_silent(1, "sent nothing for 9 s after the server's reply (hung?)")  # already
    assert server.state.silent == {2} and sorted(server.state.lost) == [1, 2]
    server.settle(timeout_s=0.1)
    broken, silent = (WorkerEndpoint(w, torch.zeros(3)) for w in (broken_wire, silent_wire))
    assert _spoken(silent) and silent.told_given_up()
    assert _spoken(broken) and not broken.told_given_up()
    for wire in (broken_wire, silent_wire):
        wire.close()


def test_the_link_reads_the_servers_end_and_only_that() -> None:
    server, (worker,) = _wires()
    link = WorkerEndpoint(worker, torch.zeros(3))
    assert not link.server_spoke()  # the server never writes there while it serves
    say_given_up(server, [1], WATCH_CHANNEL)
    server.close()
    assert _spoken(link) and link.told_given_up()
    assert link.server_spoke() and not link.told_given_up()  # then the end of the stream
    worker.close()
    # a bare end: the server failed, or closed without a word
    server, (worker,) = _wires()
    server.close()
    link = WorkerEndpoint(worker, torch.zeros(3))
    assert _spoken(link) and not link.told_given_up()
    worker.close()
    assert not WorkerEndpoint(worker, torch.zeros(3)).told_given_up()  # closed here


def test_an_exchange_that_raises_marks_the_link_failed() -> None:
    server, (worker,) = _wires()
    link = WorkerEndpoint(worker, torch.zeros(3))
    with pytest.raises(RuntimeError), link.exchanging():
        assert link.in_exchange == 1
        raise RuntimeError("the server is gone")
    assert link.in_exchange == 0 and link.failed
    server.close()
    worker.close()


def test_only_a_process_without_a_supervisor_watches_and_without_mpi_leaves_on_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(JOINED_MARK_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert not supervised() and watch_wanted()  # torchrun, srun, tether launch without --method
    monkeypatch.setenv(JOINED_MARK_ENV, "/tmp/marks/joined-rank-1")
    assert supervised() and not watch_wanted()  # tether launch --method: the supervisor ends it
    monkeypatch.delenv(JOINED_MARK_ENV)

    class _MPI:  # mpi4py.MPI once tether.init has started MPI (mpiexec)
        finalized = False

        @staticmethod
        def Is_initialized() -> bool:
            return True

        @classmethod
        def Is_finalized(cls) -> bool:
            return cls.finalized

    monkeypatch.setitem(sys.modules, "mpi4py.MPI", _MPI)
    # the watch finalizes MPI before it leaves (leave_job), but a failing worker needs no rule:
    # its exit waits in MPI's finalize for the others anyway
    assert watch_wanted() and not own_failure_wanted()
    _MPI.finalized = True
    assert watch_wanted() and own_failure_wanted()


class _Lines:
    """The reply lines as ``_lose_silent`` reads them: rank 1 never read its reply, rank 2
    read it long ago and has sent nothing since."""

    def __init__(self, now: float) -> None:
        self.now = now

    def overdue(self, silence: float) -> dict[int, float]:
        return {1: 9.0}

    def last_completed(self, rank: int) -> tuple[float, float] | None:
        return (self.now - 10.0, self.now - 9.0) if rank == 2 else None


def test_both_kinds_of_silence_are_told_at_the_end() -> None:
    server_wire, workers = _wires(3)
    server = ServerEndpoint(server_wire, torch.zeros(3), silence_timeout_s=1.0)
    server.lines = _Lines(time.monotonic())  # type: ignore[assignment]
    server._lose_silent(1.0)
    assert sorted(server.state.lost) == [1, 2] and server.state.silent == {1, 2}
    server_wire.close()
    for wire in workers:
        wire.close()


# leave_job on a thread of its own, under a stand-in for mpi4py.MPI whose finalize raises (the
# MPI standard wants it on the thread that initialized MPI) or whose thread level is funneled;
# the main thread hangs as a stuck loop does.
LEAVING = """
import sys, threading, time, types
mpi = types.ModuleType("mpi4py.MPI")
mpi.THREAD_MULTIPLE = 3
mpi.Is_initialized = lambda: True
mpi.Is_finalized = lambda: False
mpi.Query_thread = lambda: {level}
def finalize():
    print("finalize called", flush=True)
    raise RuntimeError("MPI_Finalize: not the main thread")
mpi.Finalize = finalize
sys.modules["mpi4py.MPI"] = mpi
from tether.methods.server_end_watch import leave_job
threading.Thread(target=leave_job, args=(7,), daemon=True).start()
time.sleep(5)
print("still alive", flush=True)
"""


@pytest.mark.parametrize(("level", "finalized"), [(3, True), (1, False)])
def test_a_leaving_worker_ends_even_where_mpi_refuses_its_finalize(
    level: int, finalized: bool
) -> None:
    # Before: a finalize that raised ended the watch's thread, and the hung process (and so
    # the job) waited for ever (found by review). Now it leaves unfinalized: the launcher
    # ends the job. Below MPI_THREAD_MULTIPLE no finalize is tried from another thread.
    done = subprocess.run(
        [sys.executable, "-c", LEAVING.format(level=level)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 7, done.stdout + done.stderr
    assert "still alive" not in done.stdout
    assert ("finalize called" in done.stdout) is finalized
