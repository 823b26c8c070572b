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
from tether.errors import TetherError
from tether.launch.env import DistEnv
from tether.launch.teardown import before_init_process_group, shut_down_process_group


@dataclass(frozen=True)
class WorkerPlacement:
    env: DistEnv
    backend: str
    device: torch.device


def resolve_backend(requested: str, local_world_size: int = 1) -> str:
    """``auto``: NCCL where this node has a GPU for each of its ranks (NCCL cannot put two
    ranks on one GPU), else gloo on the CPU. An explicit ``nccl`` without enough GPUs is refused
    in one line rather than failing inside CUDA on the first rank without a device."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return "nccl" if gpus >= local_world_size else "gloo"
    if requested == "nccl" and gpus < local_world_size:
        raise TetherError(
            f"backend nccl needs one GPU per rank: {local_world_size} ranks on this node, "
            f"{gpus} GPU(s) visible; use fewer workers or --backend gloo"
        )
    return requested


def place(requested: str, env: DistEnv) -> tuple[str, torch.device]:
    """This rank's backend and device: with NCCL its own GPU (``cuda:LOCAL_RANK``, made the
    current device so collectives and allocations land there), else the CPU."""
    backend = resolve_backend(requested, env.local_world_size)
    if backend != "nccl":
        return backend, torch.device("cpu")
    device = torch.device("cuda", env.local_rank)
    torch.cuda.set_device(device)
    return backend, device


def init_process_group(backend: str, env: DistEnv, timeout_s: float) -> None:
    """The default process group. With NCCL it is two backends in one group: NCCL for CUDA
    tensors (the payloads) and gloo for CPU tensors, so the small control tensors that stay on
    the CPU (evaluation totals, stop flags, message headers, any-source receives, which NCCL
    does not have) need no copy to the GPU and no special case in the callers."""
    before_init_process_group()
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if backend == "nccl" else backend,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def init_worker(config: TrainConfig) -> WorkerPlacement:
    """One thread, the process group (env:// rendezvous from the launcher), the device."""
    torch.set_num_threads(1)
    env = DistEnv.read()
    backend, device = place(config.backend, env)
    init_process_group(backend, env, config.timeout_s)
    return WorkerPlacement(env, backend, device)


@record
def run_worker(config_toml: str) -> None:
    """Entry point of a worker process: ``config_toml`` is the fully resolved config."""
    import tomllib

    from tether.config import apply_overrides
    from tether.training.trainer import Trainer

    config = apply_overrides(TrainConfig(), tomllib.loads(config_toml))
    placement = init_worker(config)
    # After a clean run only. After an error the group is left as it is: closing this rank's
    # connections before ``record`` has written the error would let a peer fail first on the
    # closed connection and be reported as the cause; the process exits right after anyway.
    Trainer(config, placement).run()
    shut_down_process_group()
