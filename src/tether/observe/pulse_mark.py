"""A server's pulse for the supervisor that runs it (:mod:`tether.launch.supervise`).

While a parameter server serves, its workers watch it (they wait for its replies, or watch its
pulse on the shared board). Once every worker has finished, nobody does: the server evaluates
the model it holds a last time and writes the results, and if it hangs there (a user's metric,
a stuck data loader, a deadlock) the run would wait for it forever. So the server beats on a
file its supervisor named in ``TETHER_SERVER_PULSE``: once when it has joined the run (the file
then holds its ``--timeout``), before each evaluation batch, around a save, and when its
serving ends. The supervisor gives the server up once every worker is done and the file's time
has stood still for that timeout, as a worker gives up a server it hears nothing from.

Standard library only (and tether.observe.files, which is too): the supervisor imports it.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

from tether.observe.files import atomic_write_text

PULSE_MARK_ENV = "TETHER_SERVER_PULSE"


def _path() -> Path | None:
    path = os.environ.get(PULSE_MARK_ENV)
    return Path(path) if path else None


def start_pulse(timeout_s: float) -> None:
    """The server has joined its run: write the file, holding the seconds its pulse may stand
    still (the run's ``--timeout``), if the supervisor named one."""
    path = _path()
    if path is not None:
        with contextlib.suppress(OSError):
            atomic_write_text(path, f"{timeout_s:g}\n")  # never read half written


def beat() -> None:
    """The server is at work: move the file's time (nothing if there is no file)."""
    path = _path()
    if path is not None:
        with contextlib.suppress(OSError):
            os.utime(path)


def read_pulse(path: Path) -> tuple[float, float] | None:
    """(the last beat's time, as ``time.time()``; the seconds it may stand still), or None
    when the server has not started its pulse or the file is not one."""
    try:
        timeout_s = float(path.read_text().strip())
        beaten = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    return (beaten, timeout_s) if math.isfinite(timeout_s) and timeout_s > 0 else None
