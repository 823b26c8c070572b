"""Processes that die with their parent (Linux ``prctl(PR_SET_PDEATHSIG)``), so that a killed
launcher leaves no orphan workers: the supervisor (:mod:`tether.launch.supervise`) asks for a
signal when the elastic agent dies, and its child for SIGKILL when the supervisor does.
Elsewhere than Linux these do nothing.

Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def exit_with_parent(sig: int) -> bool:
    """Ask Linux to send us ``sig`` when our parent (the elastic agent) dies, so a killed agent
    leaves no orphan workers. False if the parent is already gone."""
    libc = _libc()
    parent = os.getppid()
    if libc is not None:
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    return os.getppid() == parent


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies (Linux)."""
    libc = _libc()  # loaded before the fork, called after it
    if libc is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec
