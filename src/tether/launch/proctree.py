"""Process trees from /proc (Linux): finding and killing every descendant of a process.

Launchers start workers in sessions of their own (torchrun per worker, MPICH's hydra per rank),
so killing a process group misses them; walking the parent links in /proc does not. Used by the
mpiexec launcher (:mod:`tether.launch.mpi`) and the emulated cluster (:mod:`tether.launch.netns`).
"""

from __future__ import annotations

import contextlib
import os
import signal


def children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc; empty where there is no /proc."""
    tree: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        entries = os.listdir("/proc")
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    # the command name (field 2) may hold spaces and parentheses: split after it
                    ppid = int(stat.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):  # exited while we looked
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` now (not ``pid`` itself)."""
    tree, found, todo = children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_all(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each pid; one that already exited is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants, whatever session they moved to. Every process
    found is stopped first so that none can fork a child after the walk and escape."""
    stopped: set[int] = set()
    while True:
        new = [p for p in [pid, *descendants(pid)] if p not in stopped]
        if not new:
            break
        signal_all(new, signal.SIGSTOP)
        stopped.update(new)
    signal_all(list(stopped), signal.SIGKILL)
