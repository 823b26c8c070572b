"""How a worker program ends and how a launcher reports a stop: one convention for the training
workers (:mod:`tether.runner`) and the benchmark's ranks
(:mod:`tether.bench.comm_worker`), and for the launchers that start them.

Under torch's elastic agent a worker's exception is written by
:func:`tether.launch.error_file.record_errors` to the agent's error file and the launcher reports
it in one line (keeping the traceback in the run directory), so the worker prints nothing itself
and exits 1. Run by hand, outside an agent, a :class:`TetherError`
is a one-line error (exit 2, as the CLI's) and anything else keeps its traceback.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from tether.errors import TetherError, WorkerFailure
from tether.launch.env import elastic_error_file

if TYPE_CHECKING:  # torch is imported where it is used
    from torch.distributed.elastic.multiprocessing.api import SignalException


def worker_exit_status(body: Callable[[], object]) -> int:
    """Run a worker program's ``body``; returns the process's exit status (0 when it finished,
    1 or 2 after an error as above). Stopped by SIGINT (Ctrl-C), it does not return: the
    process ends at once with 130 (see :func:`leave_interrupted`)."""
    try:
        body()
    except KeyboardInterrupt:  # the launcher is stopping the run (Ctrl-C): no traceback
        leave_interrupted()
    except TetherError as exc:
        if elastic_error_file() is None:
            print(f"tether: error: {exc}", file=sys.stderr)
            return 2
        return 1
    except Exception:
        if elastic_error_file() is None:
            raise
        return 1
    return 0


def leave_interrupted() -> NoReturn:
    """End an interrupted worker now, with status 130, without the interpreter's teardown. The
    body has unwound (its ``finally`` blocks closed the logs; every file is written atomically),
    but background threads (a reducer's communication thread, a server's) may still be blocked
    in gloo operations, and the process group's destructor running under them calls
    std::terminate: "terminate called without an active exception", "Fatal Python error:
    Aborted" on the user's Ctrl-C."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signal.SIGINT)


def stopped(stop: SignalException) -> BaseException:
    """What a launcher raises when the elastic agent stopped the workers because this process
    was told to stop: Ctrl-C stays a KeyboardInterrupt (the CLI exits 130 without a traceback),
    another signal (kill, a scheduler's SIGTERM) is a one-line WorkerFailure."""
    if stop.sigval == signal.SIGINT:
        return KeyboardInterrupt()
    return WorkerFailure(f"stopped by {stop.sigval.name}; the workers were stopped", [])
