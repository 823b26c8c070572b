"""The training worker: a resolved config (and, for ``tether.fit``, the caller's task) in, a
trained run directory out.

Every launcher ends here: the local elastic launch calls :func:`run_worker` in each spawned
process; the supervisor of asynchronous runs starts ``python -m tether.runner CONFIG.toml
[TASK.pt]``; ``torchrun ... -m tether.run`` calls :func:`run_worker` after parsing options. The
worker sets up its process (:mod:`tether.launch.worker`), builds the task (from the config's names
and import paths, or unpickles the one ``tether.fit`` wrote), and runs the trainer.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from tether.catalog import gpu_free_ranks, method_backend, task_from_config
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.config_sources import apply_overrides
from tether.launch.env import DistEnv, cache_dir, server_wire_address
from tether.launch.error_file import record_errors
from tether.launch.exits import worker_exit_status
from tether.launch.local import launch_local
from tether.launch.partition import Partition
from tether.launch.teardown import shut_down_process_group
from tether.launch.worker import init_worker
from tether.methods import METHODS, Placement
from tether.training.run_dir import prepare_run_dir
from tether.training.task import Task
from tether.training.task_file import read_task
from tether.training.trainer import Trainer, WorkerRuntime


def placement_of(env: DistEnv, partition: Partition | None = None) -> Placement:
    """The launcher's facts a method needs, as values."""
    return Placement(
        local_world_size=env.local_world_size,
        run_id=env.run_id,
        cache_dir=cache_dir(),
        partition=partition.summary() if partition is not None else None,
        server_address=server_wire_address(env),
    )


@record_errors
def run_worker(config_toml: str, task_file: str | None = None) -> None:
    """Entry point of a training worker: ``config_toml`` is the fully resolved config;
    ``task_file`` the task ``tether.fit`` wrote (None: build it from the config's names)."""
    config = apply_overrides(TrainConfig(), tomllib.loads(config_toml))
    setup = init_worker(
        method_backend(config.method, config.backend),
        config.timeout_s,
        config.threads_per_worker,
        config.pin_workers,
        gpu_free_ranks(config.method),
    )
    config = config.on_nodes_of(setup.env.local_world_size)  # the node's batch sets the rate
    task: Task = read_task(Path(task_file)) if task_file else task_from_config(config)
    runtime = WorkerRuntime(
        TorchTransport(), setup.device, placement_of(setup.env, setup.partition)
    )
    Trainer(config, task, runtime).run()
    # After a clean run only. After an error the group is left as it is: closing this rank's
    # connections before ``record_errors`` has written the error would let a peer fail first on
    # the closed connection and be reported as the cause; the process exits right after anyway.
    shut_down_process_group()


def launch_training(
    config: TrainConfig, task_file: Path | None = None, overwrite: bool = False
) -> None:
    """Run the training job on local worker processes (the caller's side: ``tether train``,
    ``tether compare``, ``tether.fit``); raises WorkerFailure when it fails. The run directory
    is checked first (:mod:`tether.training.run_dir`): TetherError before anything changes."""
    prepare_run_dir(config, overwrite)
    method = METHODS.get(config.method)
    launch_local(
        config,
        config.workers + method.server_processes,
        run_worker,
        "tether.runner",
        (str(task_file),) if task_file is not None else (),
        tolerant=bool(getattr(method, "tolerates_worker_loss", False)),
        servers=method.server_processes,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m tether.runner CONFIG.toml [TASK]``: the program the supervisor starts."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m tether.runner CONFIG.toml [TASK]", file=sys.stderr)
        return 2
    task = args[1] if len(args) == 2 else None
    return worker_exit_status(lambda: run_worker(Path(args[0]).read_text(), task))


if __name__ == "__main__":
    sys.exit(main())
