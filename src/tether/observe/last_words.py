"""The last line of a process that is about to end itself (``os._exit``) because its main thread
is stuck: written straight to fd 2, then what the process had buffered flushed, on a thread of
its own and for a bounded time. The stuck thread may hold ``sys.stderr``'s lock, and a full pipe
(nobody reading the launcher's end) would block a write for ever.

Standard library only: the supervisor's modules import what imports it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading


def say_last_words(text: str, seconds: float = 1.0) -> None:
    """Write ``text`` to fd 2 and flush stdout and stderr, waiting at most ``seconds``."""
    say = threading.Thread(target=_say, args=(text.encode(),), daemon=True)
    say.start()
    say.join(seconds)


def _say(data: bytes) -> None:
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(2, data) :]
    for stream in (sys.stdout, sys.stderr):  # what the process printed before
        with contextlib.suppress(Exception):
            stream.flush()
