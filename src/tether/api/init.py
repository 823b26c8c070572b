"""``tether.init``: join a distributed run from the user's own training script.

Run the script under any launcher: ``torchrun --nproc-per-node 4 train.py``, ``srun`` (SLURM),
``mpiexec -n 4`` (MPICH or Open MPI), a Kubeflow PyTorchJob, or ``tether launch --workers 4
train.py``. ``init`` finds this process's rank, the world size and the rendezvous address from
that launcher's variables (:meth:`~tether.launch.env.DistEnv.detect`), starts the process group
(gloo on the CPU, NCCL where every local rank has a GPU; a parameter server's rank needs none of
its own: :func:`~tether.launch.worker.place`), and returns a
:class:`~tether.api.context.Context`. Under MPI without MASTER_ADDR/MASTER_PORT the ranks agree on
them through MPI (mpi4py, the ``tether[mpi]`` extra).
"""

from __future__ import annotations

import dataclasses
import socket
import warnings
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from tether.api.context import Context
from tether.catalog import check_names, gpu_free_ranks, method_backend, method_defaults
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.config_sources import resolve_config
from tether.errors import TetherError
from tether.ignored_settings import warn_ignored
from tether.launch.env import (
    DistEnv,
    launcher_method,
    launcher_reports_errors,
    pin_loopback_if_local,
)
from tether.launch.error_file import record_uncaught_errors
from tether.launch.worker import (
    init_process_group,
    partition_node,
    place,
    rendezvous_store,
)
from tether.methods import METHODS
from tether.methods.own_failure import withdraw
from tether.runner import placement_of
from tether.training.model_parallel import (
    check_method_composes,
    check_model_parallel,
    plan_option,
)

COMPONENT_KEYS = ("model", "dataset", "loss", "optimizer", "lr_schedule", "metrics")
# What a trainer's run decides and your own loop decides for itself: given to tether.init, they
# did nothing without a word.
LOOP_KEYS = (
    "epochs", "steps", "eval_every", "eval_batch_size", "target", "target_accuracy",
    "stop_at_target", "checkpoint_every", "out", "resume", "progress", "tensorboard",
    "loader_workers",
)  # fmt: skip
# the named optimizers' own settings: in one's own loop the optimizer is the one passed to
# ctx.wrap (which has its own), or the method's, which takes none of them
NAMED_OPTIMIZER_KEYS = ("nesterov", "lars_eta", "trust_exclude")
_generation = 0  # process groups this process has started: each meets under its own key prefix


def init(method: str | None = None, **options: Any) -> Context:
    """Join the run as this process's launcher placed it; returns the context whose ``wrap``
    binds ``method`` (default: the one ``tether launch --method`` named, else sync-easgd) to
    your model and optimizer. ``options`` are config keys (``tau``, ``alpha``, ``allreduce``,
    ``compress``, ``batch_size``, ``accumulate``, ``lr`` for a default optimizer, ``backend``,
    ``timeout_s``, ``seed``, ...)."""
    # under an agent, the launcher's report of this rank's failure carries the exception's line
    record_uncaught_errors()
    if dist.is_initialized():
        # torch's own words ("initialize the default process group twice") name no way out
        raise TetherError(
            "this process is still in a run (an earlier tether.init, or torch.distributed's "
            "own process group): end it with ctx.finish() (or "
            "torch.distributed.destroy_process_group()) before calling tether.init again"
        )
    withdraw()  # an earlier run's worker, in this process, no longer leaves on its failures
    launched_for = launcher_method()
    if method is not None and launched_for is not None and method != launched_for:
        raise TetherError(
            f"tether launch started this script for {launched_for}, but it asks for {method}: "
            "use the same --method for both (or leave it out of tether.init)"
        )
    method = method or launched_for or "sync-easgd"
    env = DistEnv.detect()
    if env.source == "mpi" and env.master_port is None:
        env = _agree_through_mpi(env)
    elif env.master_port is None and env.world_size > 1:
        raise TetherError(
            f"{env.world_size} processes but no rendezvous address: set MASTER_ADDR and "
            "MASTER_PORT (or start the script with torchrun, srun or tether launch)"
        )
    servers = METHODS.get(method).server_processes
    if env.world_size <= servers:
        raise TetherError(
            f"{method} needs a server process and at least one worker: start "
            f"{servers + 1} or more processes (it has {env.world_size})"
        )
    unknown = [key for key in options if key in COMPONENT_KEYS]
    if unknown:
        raise TetherError(
            f"tether.init takes no {', '.join(unknown)}: in your own loop you build them and "
            "pass the model, the optimizer and any scheduler to ctx.wrap (a named warm-up and "
            "decay: tether.optim.NamedSchedule)"
        )
    config, own_optimizer = init_configs(method, env.world_size - servers, options)
    # the node's batch sets a two-level rate: the launcher's node size where none is given
    config = config.on_nodes_of(env.local_world_size)
    own_optimizer = own_optimizer.on_nodes_of(env.local_world_size)
    check_names(config, supplied=COMPONENT_KEYS)
    check_model_parallel(config)
    given = frozenset(options) - set(NAMED_OPTIMIZER_KEYS)  # (said by _warn_loop_settings)
    if env.rank == 0:
        # the schedule is always the loop's own (ctx.wrap's scheduler): none is built here
        warn_ignored(config, given, stacklevel=2, supplied=["lr_schedule"])
        _warn_loop_settings(options, env.world_size - servers)
        if servers and launched_for is None and launcher_reports_errors():
            warnings.warn(_server_taken_note(method, env.world_size), stacklevel=2)
    partition = partition_node(env, config.threads_per_worker, config.pin_workers)
    pin_loopback_if_local(env)
    backend, device = place(method_backend(method, config.backend), env, gpu_free_ranks(method))
    global _generation
    store = rendezvous_store(env, config.timeout_s, _generation)
    _generation += 1
    init_process_group(backend, env, config.timeout_s, store)
    placement = placement_of(env, partition)
    return Context(config, TorchTransport(), device, env, placement, own_optimizer, given)


def _server_taken_note(method: str, processes: int) -> str:
    """What ``tether launch --workers N`` without ``--method`` did to a script of a method with
    a server: it started N processes, and rank 0 of them serves."""
    return (
        f"{method} serves on rank 0, so of the {processes} processes tether launch started "
        f"without --method, {processes - 1} train: give it --method {method} to start "
        f"{processes} workers and the server"
    )


def _warn_loop_settings(options: Mapping[str, Any], workers: int) -> None:
    """Say, once, which of ``options`` nothing in a user's own loop reads."""
    unread = [key for key in LOOP_KEYS if key in options]
    if unread:
        warnings.warn(
            f"tether.init ignores {', '.join(unread)}: your own loop decides its length, "
            "evaluations, checkpoints and logs (tether.fit takes them)",
            stacklevel=3,
        )
    named = [key for key in NAMED_OPTIMIZER_KEYS if key in options]
    if named:  # it said "applies to optimizer='lars' only", which tether.init refuses
        warnings.warn(
            f"tether.init ignores {', '.join(named)}: set it on the optimizer you pass to "
            "ctx.wrap (tether.optim.LARS(params, eta=...), torch.optim.SGD(..., nesterov=True))",
            stacklevel=3,
        )
    if "workers" in options and options["workers"] != workers:
        warnings.warn(
            f"tether.init ignores workers={options['workers']}: the launcher started "
            f"{workers} (torchrun --nproc-per-node, tether launch --workers)",
            stacklevel=3,
        )


def init_configs(
    method: str, workers: int, options: Mapping[str, Any]
) -> tuple[TrainConfig, TrainConfig]:
    """The run's config for ``tether.init``, and the one that applies when ``ctx.wrap`` gets an
    optimizer of the user's own: then the method's defaults for its own rate (scaling, warm-up,
    a clip) do not apply, the same rule as tether.fit's."""
    # Your loop picks its batch (ctx.sampler's default is batch_size): a method's held global
    # batch (global_batch_max, the own-batch methods') is for the loaders tether.fit builds.
    values = {
        "batch_size": TrainConfig.batch_size,
        **options,
        "method": method,
        "workers": workers,
    }
    if "parallel_plan" in values:  # a dict plan, as the config keeps it
        values["parallel_plan"] = plan_option(values["parallel_plan"])
    check_method_composes(method, values.get("model_parallel"))  # before the worker count
    config = resolve_config(None, values, method_defaults=method_defaults)
    own_optimizer = resolve_config(
        None, {"lr_base_batch": 0, **values}, method_defaults=method_defaults
    )
    return config, own_optimizer


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _agree_through_mpi(env: DistEnv) -> DistEnv:
    """Under mpiexec without MASTER_ADDR/PORT: rank 0 picks its host and a free port and MPI
    broadcasts them (mpi4py), as Lightning's MPI environment does."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise TetherError(
            "under mpiexec, set MASTER_ADDR and MASTER_PORT (mpiexec -genv MASTER_ADDR host "
            "-genv MASTER_PORT 29500), or install mpi4py (pip install 'tether[mpi]') so the "
            "ranks can agree on them"
        ) from None
    import numpy as np

    comm = MPI.COMM_WORLD
    # A fixed-size raw buffer (no pickle on the wire): 2 bytes of port, 1 of length, the host.
    buffer = np.zeros(258, dtype=np.uint8)
    if comm.Get_rank() == 0:
        local = env.local_world_size == env.world_size
        name = ("127.0.0.1" if local else socket.gethostname()).encode()[:255]
        chosen = _free_port()
        buffer[:3] = [chosen >> 8, chosen & 0xFF, len(name)]
        buffer[3 : 3 + len(name)] = np.frombuffer(name, dtype=np.uint8)
    comm.Bcast(buffer, root=0)
    port = (int(buffer[0]) << 8) | int(buffer[1])
    host = bytes(buffer[3 : 3 + int(buffer[2])]).decode()
    return dataclasses.replace(env, master_addr=host, master_port=port)
