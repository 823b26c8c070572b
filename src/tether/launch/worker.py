"""Worker process setup and the worker entry point used by every launcher.

The same :func:`run_worker` runs under our local elastic launch, under ``torchrun`` (through
``python -m tether.run``) and under SLURM ``srun`` + torchrun: it only needs the standard
environment that those launchers provide.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from tether.config import TrainConfig
from tether.launch.env import DistEnv


@dataclass(frozen=True)
class WorkerPlacement:
    env: DistEnv
    backend: str
    device: torch.device


def resolve_backend(requested: str) -> str:
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return requested


def init_worker(config: TrainConfig) -> WorkerPlacement:
    """One thread, the process group (env:// rendezvous from the launcher), the device."""
    torch.set_num_threads(1)
    env = DistEnv.read()
    backend = resolve_backend(config.backend)
    if backend == "nccl":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=config.timeout_s),
    )
    return WorkerPlacement(env, backend, device)


@record
def run_worker(config_toml: str) -> None:
    """Entry point of a worker process: ``config_toml`` is the fully resolved config."""
    import tomllib

    from tether.config import apply_overrides
    from tether.training.trainer import Trainer

    config = apply_overrides(TrainConfig(), tomllib.loads(config_toml))
    placement = init_worker(config)
    try:
        Trainer(config, placement).run()
    finally:
        dist.destroy_process_group()
