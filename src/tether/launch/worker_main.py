"""Worker entry as a program: ``python -m tether.launch.worker_main CONFIG.toml``.

The process started by :mod:`tether.launch.supervise`. It runs :func:`run_worker` with the fully
resolved config that the local launcher wrote to a file.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from tether.launch.env import elastic_error_file
from tether.launch.worker import run_worker


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tether.launch.worker_main CONFIG.toml", file=sys.stderr)
        return 2
    try:
        run_worker(Path(args[0]).read_text())
    except KeyboardInterrupt:  # the launcher is stopping the run (Ctrl-C): no traceback
        return 128 + signal.SIGINT
    except Exception:
        if elastic_error_file() is None:
            raise
        # @record put the exception in the agent's error file; the launcher reports it in one
        # line and keeps the traceback in the run directory, so do not print it here too.
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
