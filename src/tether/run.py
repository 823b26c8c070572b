"""Worker entry for external launchers: ``torchrun ... -m tether.run [train options]``.

Multi-node runs use torchrun (or SLURM ``srun`` running torchrun) for processes and rendezvous;
every process runs this module with the same options. The worker count is the launcher's world
size minus the method's server processes.
"""

from __future__ import annotations

import sys

from tether.cli import OneLineParser, add_train_options, config_from_args
from tether.config import apply_overrides
from tether.errors import TetherError
from tether.launch.env import DistEnv
from tether.launch.worker import run_worker
from tether.methods import METHODS


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m tether.run")
    add_train_options(parser)
    args = parser.parse_args(argv)
    env = DistEnv.read()
    try:
        config = config_from_args(args, lambda c: f"runs/{c.method}-{env.run_id or 'torchrun'}")
        servers = METHODS.get(config.method).server_processes
        config = apply_overrides(config, {"workers": env.world_size - servers}).validate()
    except TetherError as exc:
        print(f"tether: error: {exc}", file=sys.stderr)
        return 2
    try:
        run_worker(config.to_toml())
    except TetherError as exc:  # e.g. a method that cannot run on this placement
        print(f"tether: error: rank {env.rank}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
