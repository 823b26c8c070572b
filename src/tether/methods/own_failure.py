"""A worker's own failure under a launcher with no supervisor of ours (``torchrun``, ``srun``,
``tether launch`` without ``--method``): the asynchronous methods carry on without it.

Under ``tether train``, ``tether.fit`` and ``tether launch --method`` a worker's supervisor hides
the failure of a worker that has joined its run from torch's elastic agent (which would
otherwise stop every process) and records it lost. With no supervisor the failing process
itself is the only place that can do so: once a worker of a method that tolerates a lost worker
has joined (the same moment its :class:`~tether.methods.server_end_watch.ServerEndWatch` is
armed: no supervisor; and no MPI started, see below), an exception that would end
its process (uncaught in a user's script on ``tether.init``, or out of ``python -m tether.run``'s
trainer) is printed with its traceback, said in one line, and the process ends with status 0:
the server hears its connection close and gives the worker up at once, as it does a dead one,
and the launcher keeps the other ranks running.

Not when one of Tether's own exchanges with the server failed: the server is then gone or hung,
and the failure must reach the launcher, which ends the run (a hung server would otherwise keep
it waiting). Not after the worker's goodbye (``ctx.finish()``): it has left the run. A worker
killed by a signal is not covered: the launcher ends the run as before. Nor is a run under
``mpiexec``, where no rule is needed: the failing rank's exit waits in MPI's finalize (mpi4py's,
at exit) until every rank has finalized, so the others carry on and the job ends with its status
1 (MPICH's Hydra); ending at once instead, without finalizing, would get the job killed.

The process ends at once (``os._exit``): its ``atexit`` handlers do not run (the interpreter's
teardown could wait for ever on threads blocked on the server's wire), so a script's own logs
are best flushed in a ``finally``.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

from tether.methods.server_end_watch import WatchedLink


class _Joined:
    """The worker that may leave on its own failure: its link, rank and method (None: none)."""

    link: WatchedLink | None = None
    rank = -1
    method = ""


def tolerate_own_failure(link: WatchedLink, rank: int, method: str) -> None:
    """The worker has joined a run that carries on without a lost worker, with no supervisor:
    from now on its own failure ends only its process, with status 0."""
    _Joined.link, _Joined.rank, _Joined.method = link, rank, method
    if not _Previous.installed:
        # Once per process: a later run's process group wraps the hook it finds (torch's
        # rank prefix), ours among it, and taking that wrapper as "the previous hook" would
        # make the two call each other for ever.
        _Previous.hook, _Previous.installed = sys.excepthook, True
        sys.excepthook = _hook


def withdraw() -> None:
    """The worker's goodbye (or a new run's start): its failures from now on are the
    launcher's to report."""
    _Joined.link = None


def leave_if_tolerated(exc: BaseException) -> None:
    """End this process with status 0 after printing ``exc`` and why, if this worker may leave
    on its own failure (see the module docstring); return otherwise."""
    link = _Joined.link
    if link is None or link.failed or not isinstance(exc, Exception):
        return  # a Ctrl-C, a SystemExit or a broken link: the launcher's to handle
    traceback.print_exception(exc, file=sys.stderr)
    print(
        f"tether: worker rank {_Joined.rank} failed ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else 'no message'}); {_Joined.method} carries "
        "on without it: this process ends with status 0 so that its launcher keeps the other "
        "ranks running (the server lists it among the lost workers)",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    # At once: the interpreter's teardown would wait on the threads still blocked on the
    # server's wire, and an atexit hook could raise again.
    os._exit(0)


class _Previous:
    hook = sys.excepthook
    installed = False


def _hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """sys.excepthook while a worker may leave on its own failure (a user's script)."""
    leave_if_tolerated(exc)
    _Previous.hook(kind, exc, tb)
