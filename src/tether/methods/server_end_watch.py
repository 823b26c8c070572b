"""A parameter-server worker given up and left behind, with no supervisor to end it.

The asynchronous methods carry on without a worker that falls silent: the server gives it up
after ``--timeout`` and finishes with the others. Under ``tether launch --method`` (and
``tether.fit``, ``tether train``) the worker's supervisor then ends it. Where nobody does
(``torchrun``, ``srun``, ``mpiexec``, ``tether launch`` without ``--method``: no joined mark, see
:mod:`tether.observe.joined`), a worker hung in its own loop (a stuck data loader, a deadlock)
would keep the launcher waiting for its process for ever, the run long over.

So the server, as its serving ends, sends each worker it gave up an END on that worker's
liveness channel (:func:`say_given_up`; nothing else is ever sent there), and a worker with no
supervisor watches that channel on a thread of its own (:class:`ServerEndWatch`, armed once the
worker has joined, disarmed by its goodbye). It ends its own process only when all of these
hold ``GRACE_S`` after the END: the worker has not said goodbye (``ctx.finish()``), its main
thread is alive and not inside one of Tether's own exchanges (which end by their own timeout
and raise), and none of those exchanges has failed (the loop then knows and handles it). A bare
end of the connection (the server failed, or this process closed it) is left to the main
thread, which hears it at its next exchange.

It exits with status 0: the run it belonged to carried on without it, as the method promises,
and a failing status would make ``torchrun`` stop the other ranks, a healthy worker still saving
its results after its ``ctx.finish()`` (or a ``tether train`` server writing the run's) among them.
Work a loop does after its last step and before ``ctx.finish()`` counts as the loop: a save or
an evaluation longer than ``--timeout`` there gets the worker given up (call ``ctx.finish()``
first). A worker stopped by a signal (SIGSTOP), or hung in native code that holds the
interpreter's lock, runs no thread and is not covered.

Under ``mpiexec`` (``tether.init`` agrees on its rendezvous through mpi4py: :func:`mpi_running`)
the other ranks, done, wait in MPI's finalize for this one, and a rank that left without
finalizing would get every other rank of the job killed by the launcher. So there the watch
finalizes MPI from its own thread first, which returns once every rank has: the job then ends
as a whole (:func:`leave_job`). The MPI standard asks for the finalize on the thread that
initialized MPI; MPICH (tried, with mpi4py's default thread level, multiple) takes it from
another. Where the thread level is lower, or the finalize fails, the process leaves without it:
the launcher then kills the job, which ends it rather than keeping it waiting.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import torch

from tether.comm.header import MessageKind
from tether.comm.messages import MessageProtocol
from tether.observe.joined import JOINED_MARK_ENV
from tether.observe.last_words import say_last_words

MPI_LEAVE_PAUSE_S = 1.0  # after MPI's finalize returned, before the process ends (leave_job)
GRACE_S = 5.0  # as the supervisor gives a worker that outlives the server (tether.launch)
POLL_S = 0.5
FLUSH_S = 1.0  # how long the leaving process waits for its buffered output


def supervised() -> bool:
    """Whether a supervisor of ours will end this process if the run gives it up: it names a
    joined mark for every process of a method that tolerates a lost worker."""
    return bool(os.environ.get(JOINED_MARK_ENV))


def say_given_up(wire: MessageProtocol, ranks: Iterable[int], channel: int) -> None:
    """The server's last word to the workers it gave up, before it closes their connections: an
    END on their liveness ``channel``. A worker that died meanwhile cannot read it (ignored)."""
    end = torch.empty(0, dtype=torch.int64)
    for rank in ranks:
        with contextlib.suppress(Exception):
            wire.send_message(end, rank, MessageKind.STOP, channel=channel)


def mpi_running() -> bool:
    """Whether this process has started MPI (``tether.init`` under ``mpiexec`` agrees on its
    rendezvous through mpi4py): a process that then leaves without finalizing it makes
    MPICH's and Open MPI's launchers kill every other rank of the job."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and bool(mpi.Is_initialized()) and not bool(mpi.Is_finalized())


def leave_job(status: int) -> None:
    """End this process with ``status`` at once, from any thread; under MPI after finalizing
    it, which waits until every rank of the job has (see the module docstring)."""
    try:
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi_running() and mpi is not None and mpi.Query_thread() == mpi.THREAD_MULTIPLE:
            mpi.Finalize()
            # MPICH's Hydra sometimes killed a rank still on its way out of its own finalize
            # when this one left at once (the job's status 9), never when it left a moment
            # later: benchmarks/results/faults_amd-epyc-2cores.md, notes of 2026-11-28
            time.sleep(MPI_LEAVE_PAUSE_S)
    finally:  # a finalize refused or failed: leaving unfinalized ends the job, not a wait
        os._exit(status)


class WatchedLink(Protocol):
    """What the watch reads of a worker's link to the server (``WorkerEndpoint``)."""

    in_exchange: int  # how many of Tether's own exchanges the main thread is inside
    failed: bool  # one of them raised: the loop knows its link is broken

    def server_spoke(self) -> bool:
        """Whether the liveness channel has something to read (a message, or its end)."""
        ...

    def told_given_up(self) -> bool:
        """Read the liveness channel: True for the server's END, False for anything else."""
        ...


class ServerEndWatch:
    """A daemon thread that ends this worker's process once the server has given it up and
    finished, if the worker's loop is stuck outside Tether (see the module docstring);
    :meth:`stop` (the worker's goodbye) ends the watch."""

    def __init__(
        self,
        link: WatchedLink,
        rank: int,
        grace_s: float = GRACE_S,
        leave: Callable[[int], None] = leave_job,
        main_alive: Callable[[], bool] = lambda: threading.main_thread().is_alive(),
    ) -> None:
        self._link = link
        self._rank = rank
        self._grace_s = grace_s
        self._leave = leave
        self._main_alive = main_alive
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="server-end-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The worker is leaving on its own: end the watch (before its connections close)."""
        self._stopped.set()
        self._thread.join(POLL_S + 2.0)  # it never waits on anything but the event and a read

    def _watch(self) -> None:
        while not self._stopped.wait(POLL_S):
            if self._link.server_spoke():
                break
        else:
            return
        if not self._link.told_given_up() or self._stopped.wait(self._grace_s):
            return
        link = self._link
        if link.in_exchange or link.failed or not self._main_alive():
            return  # it ends by its exchange's own timeout, handles its failure, or is exiting
        message = (
            f"tether: worker rank {self._rank}: the parameter server gave this worker up (silent "
            f"for the run's timeout_s, --timeout) and has finished; {self._grace_s:g} s later its loop has still not "
            "reached ctx.finish(): the process ends itself (status 0"
            + (", once MPI's finalize has waited for the other ranks" if mpi_running() else "")
            + ") so that its launcher does not wait for it\n"
        )
        say_last_words(message, FLUSH_S)  # not through sys.stderr: the stuck thread may hold it
        self._leave(0)


def watch_wanted() -> bool:
    """A worker with no supervisor to end it should the run leave it behind."""
    return not supervised()


def own_failure_wanted() -> bool:
    """A worker with no supervisor, whose early exit on its own failure would harm nobody else
    (under MPI its exit waits in MPI's finalize for the others anyway:
    :mod:`tether.methods.own_failure`)."""
    return watch_wanted() and not mpi_running()
