"""How a worker program ends and how a launcher reports a stop: one convention for the training
workers (:mod:`tether.runner`) and the benchmark's ranks
(:mod:`tether.bench.comm_worker`), and for the launchers that start them.

Under torch's elastic agent a worker's exception is written by ``@record`` to the agent's error
file and the launcher reports it in one line (keeping the traceback in the run directory), so the
worker prints nothing itself and exits 1. Run by hand, outside an agent, a :class:`TetherError`
is a one-line error (exit 2, as the CLI's) and anything else keeps its traceback.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from tether.errors import TetherError, WorkerFailure
from tether.launch.env import elastic_error_file

if TYPE_CHECKING:  # torch is imported where it is used
    from torch.distributed.elastic.multiprocessing.api import SignalException


def worker_exit_status(body: Callable[[], object]) -> int:
    """Run a worker program's ``body``; returns the process's exit status (0 when it finished,
    130 when the launcher stopped it with SIGINT, 1 or 2 after an error as above)."""
    try:
        body()
    except KeyboardInterrupt:  # the launcher is stopping the run (Ctrl-C): no traceback
        return 128 + signal.SIGINT
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


def stopped(stop: SignalException) -> BaseException:
    """What a launcher raises when the elastic agent stopped the workers because this process
    was told to stop: Ctrl-C stays a KeyboardInterrupt (the CLI exits 130 without a traceback),
    another signal (kill, a scheduler's SIGTERM) is a one-line WorkerFailure."""
    if stop.sigval == signal.SIGINT:
        return KeyboardInterrupt()
    return WorkerFailure(f"stopped by {stop.sigval.name}; the workers were stopped", [])
