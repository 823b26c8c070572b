"""A server's pulse for the supervisor that runs it (:mod:`tether.launch.supervise`).

While a parameter server serves, its workers watch it (they wait for its replies, or watch its
pulse on the shared board). Once every worker has finished, nobody does: the server evaluates
the model it holds a last time and writes the results, and if it hangs there (a user's metric,
a stuck data loader, a deadlock) the run would wait for it forever. So the server beats on a
file its supervisor named in ``TETHER_SERVER_PULSE``: once when it has joined the run (the file
then holds its ``--timeout``), before each evaluation batch, around a save, and when its
serving ends. The supervisor gives the server up once every worker is done and the file's time
has stood still for that timeout, as a worker gives up a server it hears nothing from.

Under a launcher with no supervisor of ours (``torchrun -m tether.run``, ``srun``, ``mpiexec``,
a script on ``tether.init``) no file is named, and the launcher would wait for a hung server for
ever. There the server watches its own beats (:func:`watch_self`, a daemon thread): while it
serves (its workers' last replies may be sent before it hangs, and a goodbye waits for no
answer), with its workers' patience, and once its serving is over. When they stand still for
that long (the timeout, or a multiple of it) it says so on stderr with its threads' stacks and
ends its process with status 1, so that the launcher fails the run naming it, as the
supervisor would. A wait inside one of Tether's own receives, which ends by its own timeout, is
not stillness (:func:`waiting`).

Standard library only (and tether.observe.files and last_words, which are too): the supervisor
imports it.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from tether.observe.files import atomic_write_text
from tether.observe.last_words import say_last_words

PULSE_MARK_ENV = "TETHER_SERVER_PULSE"


def _path() -> Path | None:
    path = os.environ.get(PULSE_MARK_ENV)
    return Path(path) if path else None


class _Beats:
    """This process's last beat (``time.monotonic()``) and the number of its self-watch (a
    watch ends when the number moves on: :func:`stop_watching`)."""

    last = 0.0
    watch = 0
    waiting = 0  # how many of Tether's own bounded receives the serving thread is inside


def start_pulse(timeout_s: float) -> None:
    """The server has joined its run: write the file, holding the seconds its pulse may stand
    still (the run's ``--timeout``), if the supervisor named one. A self-watch left from an
    earlier run in this process ends: while it serves, the server's workers watch it."""
    stop_watching()
    path = _path()
    if path is not None:
        with contextlib.suppress(OSError):
            atomic_write_text(path, f"{timeout_s:g}\n")  # never read half written


def beat() -> None:
    """The server is at work: move the file's time (if there is a file) and the self-watch's."""
    awake()
    path = _path()
    if path is not None:
        with contextlib.suppress(OSError):
            os.utime(path)


def awake() -> None:
    """The serving thread is awake (between messages): the self-watch's time only. The file's
    is for the supervisor, which reads it once every worker is done, not while it serves, so
    the serving loop does not write it for every message."""
    _Beats.last = time.monotonic()


def read_pulse(path: Path) -> tuple[float, float] | None:
    """(the last beat's time, as ``time.time()``; the seconds it may stand still), or None
    when the server has not started its pulse or the file is not one."""
    try:
        timeout_s = float(path.read_text().strip())
        beaten = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    return (beaten, timeout_s) if math.isfinite(timeout_s) and timeout_s > 0 else None


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """The serving thread waits in one of Tether's own receives (a round-robin server's read of
    its next worker): it ends by its own timeout and the server handles that, so the wait is
    not stillness; the server is awake when it ends."""
    _Beats.waiting += 1
    try:
        yield
    finally:
        _Beats.waiting -= 1
        awake()


AFTER_SERVING = (
    "after every worker had finished: its pulse (its final evaluation, saving the results)"
)
WHILE_SERVING = "while it served its workers: its pulse (the loop that answers their messages)"


def watch_self(
    who: str, timeout_s: float, situation: str = AFTER_SERVING, patience: float = 1.0
) -> None:
    """No supervisor watches this process (no file named), and nobody else does (its serving
    is over, or its workers wait for nothing from it): end it, saying why, if its beats stand
    still for ``patience`` x ``timeout_s`` from now on (``who``: "server rank 0"; ``situation``:
    when and what, as the message says it; ``patience``: how many timeouts its watchers would
    wait). Stops with :func:`stop_watching` (the results are written; a new
    :func:`start_pulse`) or with the process."""
    if _path() is not None or not (math.isfinite(timeout_s) and timeout_s > 0):
        return
    beat()
    _Beats.watch += 1
    threading.Thread(
        target=_watch,
        args=(who, timeout_s, patience, situation, _Beats.watch),
        name="tether-self-watch",
        daemon=True,
    ).start()


@contextlib.contextmanager
def watching_self(
    who: str, timeout_s: float, situation: str, patience: float = 1.0
) -> Iterator[None]:
    """:func:`watch_self` for the block, :func:`stop_watching` when it ends, however."""
    watch_self(who, timeout_s, situation, patience)
    try:
        yield
    finally:
        stop_watching()


def stop_watching() -> None:
    """The run is over (or a new one serves): the self-watch, if any, ends without a word."""
    _Beats.watch += 1


SAY_S = 1.0  # how long the leaving process waits for its last words to reach stderr


def _watch(who: str, timeout_s: float, patience: float, situation: str, number: int) -> None:
    limit = patience * timeout_s
    allowed = f"--timeout {timeout_s:g} s"
    allowed = allowed if patience == 1 else f"{patience:g} x {allowed}"
    while _Beats.watch == number:
        if _Beats.waiting:
            _Beats.last = time.monotonic()
        still = time.monotonic() - _Beats.last
        if still >= limit:
            text = (
                f"tether: {who} stopped answering {situation} stood still for {still:.0f} s "
                f"({allowed}); it ends with status 1 (its threads' stacks follow)\n"
                + _other_stacks()
            )
            say_last_words(text, SAY_S)
            os._exit(1)  # the main thread is stuck: no exception would reach it
        time.sleep(min(limit - still, 1.0))


def _other_stacks() -> str:
    """Where every thread but this watch is, as a traceback prints it (the main thread: where
    the server is stuck)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "".join(
        f"thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
        if ident != threading.get_ident()
    )
