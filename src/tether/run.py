"""Worker entry for external launchers: ``torchrun ... -m tether.run [train options]``.

Multi-node runs use torchrun (or SLURM ``srun`` running torchrun) for processes and rendezvous;
every process runs this module with the same options. The worker count is the launcher's world
size minus the method's server processes. With ``--timeline``, rank 0 merges the timeline
(``DIR/timeline.json``) at the end; ranks on other machines need ``python -m
tether.observe.timeline DIR`` after their ``DIR/timeline/`` files are copied together.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from tether.catalog import warn_oversubscribed
from tether.cli import OneLineParser
from tether.config import TrainConfig
from tether.errors import TetherError, warnings_in_one_line
from tether.ignored_settings import IgnoredSettingWarning, warn_ignored
from tether.launch.env import DistEnv
from tether.launch.partition import usable_cores
from tether.methods.own_failure import leave_if_tolerated
from tether.observe.summary import run_summary_text
from tether.observe.timeline import merge_after_run
from tether.runner import run_worker
from tether.train_options import add_train_options, as_flag, config_from_args, given_values

# What torchrun (and srun running it) sets for every worker; the process group needs them all.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def worker_config(args: argparse.Namespace, env: DistEnv) -> TrainConfig:
    """The run's config, its workers the launcher's world size less the method's servers; rank
    0 warns, as ``tether train`` does, of settings the run will not use (a --workers the
    launcher's count overrides among them)."""
    given = given_values(args)
    config = config_from_args(
        args,
        lambda c: f"runs/{c.method}-{env.run_id or 'torchrun'}",
        given,
        world_size=env.world_size,
    )
    if env.local_rank == 0:  # each node's processes on its cores (tether train: check_launch)
        warn_oversubscribed(env.local_world_size, len(usable_cores()))
    if env.rank == 0:
        warn_ignored(config, set(given) - {"workers"}, spell=as_flag)
        asked = given.get("workers")
        if asked is not None and asked != config.workers:
            warnings.warn(
                f"--workers {asked} is ignored: the launcher started {env.world_size} processes, "
                f"so {config.method} runs {config.workers} workers",
                IgnoredSettingWarning,
                stacklevel=2,
            )
    return config


def main(argv: list[str] | None = None) -> int:
    warnings_in_one_line()
    parser = OneLineParser(prog="python -m tether.run")
    add_train_options(parser)
    args = parser.parse_args(argv)
    missing = [name for name in LAUNCHER_VARIABLES if name not in os.environ]
    if missing:
        print(
            f"tether: error: no launcher started this process ({', '.join(missing)} not set): "
            "run it under one (torchrun --nproc-per-node 4 -m tether.run ...), or use "
            "`tether train`, which launches the workers itself",
            file=sys.stderr,
        )
        return 2
    env = DistEnv.read()
    try:
        config = worker_config(args, env)
    except TetherError as exc:
        print(f"tether: error: {exc}", file=sys.stderr)
        return 2
    try:
        run_worker(config.to_toml())
    except TetherError as exc:  # e.g. a method that cannot run on this placement
        leave_if_tolerated(exc)  # a joined worker of an asynchronous method: the run goes on
        print(f"tether: error: rank {env.rank}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        leave_if_tolerated(exc)
        raise
    else:
        out = Path(config.out) if config.out is not None else None
        if env.rank == 0 and out is not None and (out / "summary.json").exists():
            print(run_summary_text(out), flush=True)  # what `tether train` prints at the end
    finally:
        # No launcher process outlives torchrun's workers. After a clean run rank 0 has merged
        # the timeline already (and this does nothing); after a failure it merges what the
        # ranks on this machine wrote. Other machines' files: docs/timeline.md.
        if config.timeline and env.rank == 0 and config.out is not None:
            merge_after_run(Path(config.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
