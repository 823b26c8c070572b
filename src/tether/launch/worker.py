"""Worker process setup: its threads and cores, the backend, the device, the process group.

The same setup runs under our local elastic launch, under ``torchrun`` and under SLURM ``srun`` +
torchrun: it only needs the standard environment that those launchers provide. What the worker
then runs is its caller's business (:mod:`tether.runner` for training runs).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tether.errors import TetherError
from tether.launch.cpuset import job_core_count
from tether.launch.env import DistEnv
from tether.launch.loopback import store_server
from tether.launch.partition import (
    Partition,
    apply_partition,
    mask_is_own,
    plan_partition,
    usable_cores,
)
from tether.launch.teardown import before_init_process_group


@dataclass(frozen=True)
class WorkerPlacement:
    env: DistEnv
    backend: str
    device: torch.device
    partition: Partition | None = None


def resolve_backend(requested: str, local_world_size: int = 1, servers: int = 0) -> str:
    """``auto``: NCCL where this node has a GPU for each of its ranks (NCCL cannot put two
    ranks on one GPU), else gloo on the CPU; a parameter server's ranks (``servers``) need no
    GPU of their own (see :func:`place`). An explicit ``nccl`` without enough GPUs is refused
    in one line rather than failing inside CUDA on the first rank without a device."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    needed = max(1, local_world_size - servers)
    if requested == "auto":
        return "nccl" if gpus >= needed else "gloo"
    if requested == "nccl" and gpus < needed:
        ranks = f"{needed} workers on this node (a server needs none)" if servers else ""
        raise TetherError(
            f"backend nccl needs one GPU per {'worker' if servers else 'rank'}: "
            f"{ranks or f'{local_world_size} ranks on this node'}, {gpus} GPU(s) visible; use "
            "fewer workers or --backend gloo"
        )
    return requested


def place(requested: str, env: DistEnv, servers: int = 0) -> tuple[str, torch.device]:
    """This rank's backend and device: with NCCL its own GPU (``cuda:LOCAL_RANK``, made the
    current device so collectives and allocations land there), else the CPU.

    The first ``servers`` ranks are a parameter server's: its exchanges cross sockets through
    host memory and it joins no NCCL collective, so it needs no GPU of its own. It takes GPU 0
    where the node has a GPU for every rank, else the CPU, and the workers one GPU each (local
    rank modulo the GPUs: on the server's node their local ranks are 1..n-1, so the last one
    takes GPU 0; on a node of n workers and n - 1 GPUs two of them share one, which their
    exchanges with the server allow). Sync methods (no server) keep ``cuda:LOCAL_RANK``."""
    backend = resolve_backend(requested, env.local_world_size, servers)
    if backend != "nccl":
        return backend, torch.device("cpu")
    gpus = torch.cuda.device_count()
    if env.rank < servers and gpus < env.local_world_size:
        return backend, torch.device("cpu")
    device = torch.device("cuda", env.local_rank % gpus)
    torch.cuda.set_device(device)
    return backend, device


def init_process_group(
    backend: str, env: DistEnv, timeout_s: float, store: dist.Store | None = None
) -> None:
    """The default process group. With NCCL it is two backends in one group: NCCL for CUDA
    tensors (the payloads) and gloo for CPU tensors, so the small control tensors that stay on
    the CPU (evaluation totals, stop flags, message headers, any-source receives, which NCCL
    does not have) need no copy to the GPU and no special case in the callers."""
    before_init_process_group()
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if backend == "nccl" else backend,
        store=store,  # None: env:// from the launcher's MASTER_ADDR/PORT
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def init_worker(
    backend: str,
    timeout_s: float,
    threads_per_worker: int = 0,
    pin: bool = True,
    servers: int = 0,
) -> WorkerPlacement:
    """This process's share of the node (threads and cores, :mod:`tether.launch.partition`),
    then the process group (env:// rendezvous from the launcher) and the device (``servers``:
    as for :func:`place`)."""
    env = DistEnv.read()
    partition = partition_node(env, threads_per_worker, pin)
    resolved, device = place(backend, env, servers)
    init_process_group(resolved, env, timeout_s)
    return WorkerPlacement(env, resolved, device, partition)


def partition_node(env: DistEnv, threads_per_worker: int, pin: bool) -> Partition:
    """Plan this node's partition among its ranks and take this rank's part of it. Under srun
    and mpiexec, which start each rank and may bind it to cores of its own, a mask that is the
    rank's own is kept whole (:func:`tether.launch.partition.mask_is_own`); torchrun's agent and
    our launcher start a node's ranks from one process and bind none, so its mask is shared."""
    cores = usable_cores()
    own = env.source in ("slurm", "mpi") and mask_is_own(
        cores, env.local_world_size, job_core_count()
    )
    partition = plan_partition(env.local_world_size, threads_per_worker, pin, cores, own)
    apply_partition(partition, env.local_rank)
    return partition


_BASE_STORES: dict[tuple[str, int], dist.Store] = {}


def rendezvous_store(env: DistEnv, timeout_s: float, generation: int) -> dist.Store:
    """The key-value store a process group meets in, for the ``generation``-th group this
    process starts: one TCP store per address, kept for the process's life (the launcher's
    agent hosts it under torchrun; else rank 0 does), and a fresh key prefix per generation, so
    a second ``tether.init`` in the same process never reads the keys of the first."""
    if env.world_size == 1:
        return dist.HashStore()  # a lone process meets nobody: nothing needs to listen
    assert env.master_port is not None
    key = (env.master_addr, env.master_port)
    if key not in _BASE_STORES:
        timeout = datetime.timedelta(seconds=timeout_s)
        if env.rank == 0 and not env.agent_store:  # served here: on MASTER_ADDR only
            _BASE_STORES[key] = store_server(env.master_addr, env.master_port, timeout)
        else:
            _BASE_STORES[key] = dist.TCPStore(
                env.master_addr, env.master_port, env.world_size, is_master=False, timeout=timeout
            )
    return dist.PrefixStore(f"tether/{generation}", _BASE_STORES[key])
