"""Whether a worker process has joined its run, for the supervisor that runs it
(:mod:`tether.launch.supervise`).

A method that carries on without a lost worker can do so only once the run has formed: a worker
that fails before (its data, its model, an error in a user's script before or inside
``tether.init``) leaves the others waiting at the rendezvous until the timeout, every one of
them then recorded lost, and the server failing last with a store timeout that names nobody. So
the supervisor tolerates the loss of a worker only after it has joined: when its method's start
(the process group, and the handshake with the server) is over, the worker touches the file the
supervisor named in ``TETHER_JOINED_MARK``; one that fails without it fails the run at once,
named.

Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

JOINED_MARK_ENV = "TETHER_JOINED_MARK"


def mark_joined() -> None:
    """Say that this process has joined its run: touch the supervisor's file, if it named one."""
    path = os.environ.get(JOINED_MARK_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path).touch()
