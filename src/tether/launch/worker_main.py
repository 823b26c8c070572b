"""Worker entry as a program: ``python -m tether.launch.worker_main CONFIG.toml``.

The process started by :mod:`tether.launch.supervise`. It runs :func:`run_worker` with the fully
resolved config that the local launcher wrote to a file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tether.launch.exits import worker_exit_status
from tether.launch.worker import run_worker


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tether.launch.worker_main CONFIG.toml", file=sys.stderr)
        return 2
    return worker_exit_status(lambda: run_worker(Path(args[0]).read_text()))


if __name__ == "__main__":
    sys.exit(main())
