"""A worker in a user's own loop that left its run before ``ctx.finish()``, for the supervisor
that runs it (:mod:`tether.launch.supervise`).

A worker of a synchronous method whose script ends with status 0 in the middle of the run (a
``sys.exit(0)`` on one rank, an ``if ctx.is_main:`` around a step or an evaluation that
communicates) leaves its peers waiting in a collective: they fail with their transport's
"connection closed by peer", and the run's report blamed them, the healthy ranks, while the
rank that left was not named (its status 0 is a success to the launcher). So a worker whose
process ends without ``ctx.finish()`` (and not on an uncaught exception, which is reported as
one) writes the file its supervisor named in ``TETHER_LEFT_MARK`` before it lets go of its
peers. Its supervisor then names it first in the run's report (a synchronous method) or records
it lost (a method that carries on without it); a worker that left only in answer to the
launcher's stop (a script that saves and exits on SIGTERM) did not leave early.

Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

LEFT_MARK_ENV = "TETHER_LEFT_MARK"
LEFT_EARLY = "left the run early: its script ended (exit status 0) without ctx.finish()"


def say_left() -> None:
    """This worker is leaving its run without ``ctx.finish()``: tell the supervisor, if any,
    naming this process (a process the worker started inherits the variable: not it)."""
    path = os.environ.get(LEFT_MARK_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text(str(os.getpid()))


def has_left(path: Path, pid: int) -> bool:
    """For the supervisor: whether its child ``pid`` said it left (:func:`say_left`)."""
    try:
        return path.read_text().strip() == str(pid)
    except OSError:
        return False
