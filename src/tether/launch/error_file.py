"""The structured error a worker leaves for torch's elastic agent, written so that the agent can
never read half of it.

torch's ``@record`` writes the error file in place (``open(path, "w")`` then ``json.dump``). When
one rank fails, the agent stops the others; a rank that is failing at the same moment (a peer of
a hung rank whose collective timed out too) can be killed between the open and the last byte,
and the agent, reading every failed rank's file, then stops on a JSONDecodeError of its own
instead of reporting the first failure. :func:`record_errors` writes the same JSON (the format
the agent and :func:`read_error_file` read) to a temporary file beside it and renames it into
place (:func:`tether.observe.files.atomic_write`): the file is absent or whole, never partial.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import ParamSpec, TypeVar

from tether.errors import TetherError
from tether.launch.env import elastic_error_file, launcher_reports_errors
from tether.observe.files import atomic_write_json

_P = ParamSpec("_P")
_R = TypeVar("_R")


def record_errors(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate a worker's entry point: an exception it raises is written to the elastic error
    file (when an agent set one) and raised again. Like ``@record``, it also turns on Python's
    fault handler, so a crash in native code still prints every thread's stack."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        faulthandler.enable(all_threads=True)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            write_error_file(exc)
            raise

    return wrapper


_hooked = False  # record_uncaught_errors has installed its hook in this process


def record_uncaught_errors() -> None:
    """Under an elastic agent (``tether launch``, torchrun), have an exception that ends a
    user's own script written to the agent's error file, as :func:`record_errors` does for
    Tether's workers: the launcher then reports the exception's first line for that rank
    instead of "exited with code 1". The hook before it still runs (the traceback is printed as
    before), except for one of Tether's own errors (a TetherError: what was wrong and how to fix
    it, in one line) under ``tether launch``, whose report prints that line once for every rank
    that failed; a traceback per rank would bury it. Nothing outside an agent."""
    global _hooked
    if _hooked or elastic_error_file() is None:
        return
    _hooked = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, Exception):  # not a Ctrl-C: the launcher reports the interrupt
            with contextlib.suppress(Exception):  # never in the way of the traceback below
                write_error_file(exc)
                if isinstance(exc, TetherError) and launcher_reports_errors():
                    return  # written: the launcher's report prints its line
        previous(kind, exc, tb)

    sys.excepthook = hook


def write_error_file(exc: BaseException) -> None:
    """Write ``exc`` (with its traceback) to the elastic error file, atomically; nothing when
    no agent asked for one."""
    path = elastic_error_file()
    if path is None:
        return
    atomic_write_json(
        Path(path),
        {
            "message": {
                "message": f"{type(exc).__name__}: {exc}",
                "extraInfo": {
                    "py_callstack": "".join(traceback.format_exception(exc)),
                    "timestamp": str(int(time.time())),
                },
            }
        },
    )


def read_error_file(path: str | None) -> dict[str, str]:
    """The exception a worker wrote to the elastic error file: message and traceback (empty
    when there is no file or it cannot be read)."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    info = data.get("message", {}) if isinstance(data, dict) else {}
    if not isinstance(info, dict):
        return {"message": str(info)}
    extra = info.get("extraInfo", {})
    return {
        "message": str(info.get("message", "")),
        "traceback": str(extra.get("py_callstack", "")) if isinstance(extra, dict) else "",
    }
