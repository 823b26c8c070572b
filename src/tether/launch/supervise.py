"""A tiny supervisor between torch's elastic agent and one worker process.

The elastic agent stops every worker as soon as one of its processes fails. That is right for
synchronous methods, but an asynchronous parameter server can carry on without a dead worker
(methods with ``tolerates_worker_loss``). For those, the local launcher starts this module in each
of the agent's worker slots; it runs the real worker as its child and, when a worker rank other
than the server (rank 0) fails, writes ``LOST_DIR/rank-R.json`` and exits 0, so the agent keeps the
others running. Any other failure is passed on with the child's exit status, and the child's
``@record`` error file (it inherits the agent's TORCHELASTIC_ERROR_FILE) still reaches the agent.

Standard library only, no torch: it must start fast and stay small.
    python -m tether.launch.supervise [--lost-dir DIR] -- COMMAND [ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from tether.launch.env import DistEnv, elastic_error_file
from tether.observe.files import atomic_write_json

SERVER_RANK = 0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this supervisor dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, called after it
    except OSError:
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os._exit(1)

    return preexec


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def read_error_file(path: str | None) -> dict[str, str]:
    """The exception ``@record`` wrote for the child: its message and traceback, if any."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    info = data.get("message", {})
    if not isinstance(info, dict):
        return {"message": str(info)}
    extra = info.get("extraInfo", {})
    return {
        "message": str(info.get("message", "")),
        "traceback": str(extra.get("py_callstack", "")) if isinstance(extra, dict) else "",
    }


def lost_record(rank: int, returncode: int, error: dict[str, str]) -> dict[str, Any]:
    now = time.time()
    how = describe_exit(returncode)
    message = error.get("message", "").strip().splitlines()
    return {
        "rank": rank,
        "returncode": returncode,
        "exit": how,
        # The worker's own exception explains more than its exit status.
        "reason": message[0] if message else how,
        "time": now,
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        "traceback": error.get("traceback", ""),
    }


class Supervisor:
    def __init__(self, command: list[str], lost_dir: Path | None) -> None:
        self.command = command
        self.lost_dir = lost_dir
        self.stop_signal: int | None = None
        self.child: subprocess.Popen[bytes] | None = None

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.stop_signal = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        rank = DistEnv.read().rank
        for sig in FORWARDED:
            signal.signal(sig, self._forward)
        # Same environment (placement, error file), same process group: the agent's killpg
        # reaches the child directly too.
        self.child = subprocess.Popen(self.command, preexec_fn=_die_with_parent())
        if self.stop_signal is not None:  # it arrived while the child was starting
            self.child.send_signal(self.stop_signal)
        returncode = self.child.wait()
        if returncode == 0:
            return 0
        if self.stop_signal is None and self.lost_dir is not None and rank != SERVER_RANK:
            record = lost_record(rank, returncode, read_error_file(elastic_error_file()))
            path = self.lost_dir / f"rank-{rank}.json"
            atomic_write_json(path, record)
            print(
                f"tether: worker rank {rank} lost ({record['reason']}); the run carries on "
                f"without it (details in {path})",
                file=sys.stderr,
                flush=True,
            )
            return 0
        if returncode < 0:
            # Die the way the child died, so the agent reports "killed by SIGKILL", not 137.
            with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
                signal.signal(-returncode, signal.SIG_DFL)
            os.kill(os.getpid(), -returncode)
            return 128 - returncode
        return returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tether.launch.supervise")
    parser.add_argument(
        "--lost-dir",
        type=Path,
        help="tolerate the loss of a worker rank other than 0: record it here and exit 0",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to supervise")
    return Supervisor(command, args.lost_dir).run()


if __name__ == "__main__":
    sys.exit(main())
