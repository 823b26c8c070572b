"""The one module that reads (and, for local launches, sets) environment variables.

torch's elastic launcher, ``torchrun`` and our local launcher describe a worker's place in the job
through the standard variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). ``tether.init`` also finds its place under the other launchers a user's own script
runs under (:meth:`DistEnv.detect`): SLURM's ``srun``, MPI's ``mpiexec`` (MPICH/Hydra and Open
MPI) and Kubeflow's PyTorchJob, as Lightning's cluster environments do. Everything else in Tether
receives these values as arguments.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tether.errors import TetherError
from tether.launch.slurm_lists import first_host, tasks_per_node


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int | None
    run_id: str | None
    # Which launcher described this process: torchrun (also our local launcher), slurm, mpi,
    # kubeflow, or none (a single process).
    source: str = "torchrun"
    # The launcher's agent hosts the rendezvous store (torchrun): every rank is its client.
    agent_store: bool = False

    @staticmethod
    def read() -> DistEnv:
        """The launcher-provided placement of this process (defaults: a single process)."""
        env = os.environ
        world = _int(env, "WORLD_SIZE", 1)
        return DistEnv(
            rank=_int(env, "RANK", 0),
            world_size=world,
            local_rank=_int(env, "LOCAL_RANK", 0),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", world),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_set_int(env, "MASTER_PORT"),
            run_id=env.get("TORCHELASTIC_RUN_ID"),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        )

    @staticmethod
    def detect() -> DistEnv:
        """This process's place under whichever launcher started it. The launcher nearest the
        process wins, since the outer ones' variables are inherited by everything below them:
        torchrun's variables first (also what ``srun torchrun`` and our launcher set: LOCAL_RANK
        or TORCHELASTIC_RUN_ID beside RANK and WORLD_SIZE), then MPI (Open MPI's
        OMPI_COMM_WORLD_*, MPICH's PMI_*: set by ``mpiexec`` for each rank, whereas an
        ``mpiexec`` inside a SLURM allocation or a PyTorchJob pod passes on the batch step's
        SLURM_PROCID=0 or the pod's RANK to every rank; ``srun --mpi=pmi2`` sets PMI_* too, and
        its tasks are read as SLURM's), then Kubeflow's PyTorchJob (RANK and WORLD_SIZE without
        LOCAL_*), SLURM (an ``srun`` step: SLURM_PROCID), else a single
        process. The rendezvous address is MASTER_ADDR/MASTER_PORT where set; under SLURM the
        first host of the job's node list and a port derived from the job id; under MPI None
        (the caller agrees on one through MPI itself)."""
        env = os.environ
        torchrun = "LOCAL_RANK" in env or "TORCHELASTIC_RUN_ID" in env
        if "RANK" in env and "WORLD_SIZE" in env and torchrun:
            return DistEnv.read()
        mpi = _mpi_keys(env)
        if mpi is not None and not _srun_pmi(env, mpi):
            return _from_mpi(env, mpi)
        if "RANK" in env and "WORLD_SIZE" in env:
            # Kubeflow's PyTorchJob: one process per pod, so every rank is alone on its node.
            read = DistEnv.read()
            return dataclasses.replace(read, local_rank=0, local_world_size=1, source="kubeflow")
        if "SLURM_PROCID" in env and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
            return _from_slurm(env)
        return dataclasses.replace(DistEnv.read(), source="none")

    @property
    def launched(self) -> bool:
        """True under a launcher that set MASTER_ADDR/MASTER_PORT (ours, torchrun, SLURM+torchrun)."""
        return self.master_port is not None


def prepare_local_environment() -> None:
    """Settings for a single-machine run, inherited by the spawned workers.

    gloo binds to the address its hostname resolves to unless told an interface; on one machine we
    pin it to loopback so nothing listens on an external address. One OpenMP thread per worker:
    N workers on a few cores would otherwise oversubscribe them and thrash.
    """
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def elastic_error_file() -> str | None:
    """Where torch's elastic agent wants this process's structured error (:mod:`tether.launch.error_file` writes it),
    or None when the process was not started by an elastic agent."""
    return os.environ.get("TORCHELASTIC_ERROR_FILE") or None


def cache_dir() -> Path:
    """Where Tether caches measurements (the collective calibration): TETHER_CACHE_DIR, else
    XDG_CACHE_HOME/tether, else ~/.cache/tether."""
    env = os.environ
    if env.get("TETHER_CACHE_DIR"):
        return Path(env["TETHER_CACHE_DIR"])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "tether"


def launcher_local_world_size() -> int | None:
    """Processes per node as the launcher reports it (LOCAL_WORLD_SIZE), None when no launcher
    says: the node layout the hierarchical collectives use."""
    return _set_int(os.environ, "LOCAL_WORLD_SIZE")


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """The integer a launcher's variable holds (``default`` where it is unset): a value that is
    not one is refused in one line naming the variable, not with int()'s bare ValueError."""
    if name not in env and default is not None:
        return default
    try:
        return int(env[name])
    except ValueError:
        raise TetherError(
            f"{name}={env[name]!r} is not an integer: set it to a whole number in the "
            "environment that starts the script, or unset it for the launcher to set"
        ) from None


def _set_int(env: Mapping[str, str], name: str) -> int | None:
    """The integer a launcher's variable holds, None where it is unset or empty."""
    return _int(env, name) if env.get(name) else None


# Each MPI's rank, size, local rank and local size variables, as its mpiexec sets them.
_MPI_KEYS = (
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def _mpi_keys(env: os._Environ[str]) -> tuple[str, str, str, str] | None:
    """The variables of the MPI that started this process (None: no MPI did)."""
    for keys in _MPI_KEYS:
        if keys[0] in env and keys[1] in env:
            return keys
    return None


def _srun_pmi(env: os._Environ[str], keys: tuple[str, str, str, str]) -> bool:
    """True where ``srun --mpi=pmi2`` set PMI_RANK/PMI_SIZE: they are then the step's own rank
    and task count, and SLURM's variables say more (the node layout, a rendezvous address), so
    the SLURM step describes the process. Told apart from ``mpiexec`` by what is the same on
    every rank, so no job's ranks split between the two readings: Hydra's ``mpiexec`` always
    sets MPI_LOCALRANKID beside PMI_RANK, and only ``srun`` sets SLURM_STEP_NUM_TASKS (an
    ``mpiexec`` in a batch script passes on the script's SLURM_PROCID=0 and SLURM_NTASKS)."""
    if keys[0] != "PMI_RANK" or keys[2] in env:
        return False
    same_rank = env.get("SLURM_PROCID") == env["PMI_RANK"]
    return same_rank and env.get("SLURM_STEP_NUM_TASKS") == env["PMI_SIZE"]


def _from_mpi(env: os._Environ[str], keys: tuple[str, str, str, str]) -> DistEnv:
    """An MPI rank's place. Without MASTER_ADDR the rendezvous is on this machine's loopback,
    which only the ranks on this node can reach: with MASTER_PORT alone (so no agreement
    through MPI either) and ranks on other nodes too (fewer local ranks than ranks, where the
    MPI says how many are local), that is refused rather than left to time out."""
    rank_key, size_key, local_key, local_size_key = keys
    world = _int(env, size_key)
    rank = _int(env, rank_key)
    local_world = _int(env, local_size_key, world)
    port = _set_int(env, "MASTER_PORT")
    if port is not None and not env.get("MASTER_ADDR") and local_world < world:
        raise TetherError(
            f"MASTER_PORT is set but MASTER_ADDR is not, and the {world} MPI ranks span more "
            f"than one node ({local_world} on this one): set MASTER_ADDR to rank 0's host, or "
            "unset MASTER_PORT for the ranks to agree on both through MPI"
        )
    return DistEnv(
        rank=rank,
        world_size=world,
        local_rank=_int(env, local_key, rank),
        local_world_size=local_world,
        master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=port,
        run_id=env.get("TETHER_RUN_ID"),
        source="mpi",
    )


def _from_slurm(env: os._Environ[str]) -> DistEnv:
    world = _int(env, "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS")
    rank = _int(env, "SLURM_PROCID")
    local_rank, local_world = _slurm_node_place(env, rank, world)
    job = _int(env, "SLURM_JOB_ID", 0)
    port = _set_int(env, "MASTER_PORT")
    return DistEnv(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        master_addr=env.get("MASTER_ADDR")
        or first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")),
        master_port=port if port is not None else 20000 + job % 20000,
        run_id=f"slurm-{job}",
        source="slurm",
    )


def _slurm_node_place(env: os._Environ[str], rank: int, world: int) -> tuple[int, int]:
    """This task's local rank and its node's task count. SLURM_STEP_TASKS_PER_NODE (else
    SLURM_TASKS_PER_NODE) lists every node's count, ``3,1`` or ``2(x3),1``, and SLURM_NODEID
    says which node this is: the nodes of an uneven step differ. SLURM_LOCALID is the local
    rank. ``srun`` sets all three; where one is missing, srun's default block distribution
    (consecutive ranks fill a node) stands in; with no list, every task is on this node."""
    key = (
        "SLURM_STEP_TASKS_PER_NODE"
        if env.get("SLURM_STEP_TASKS_PER_NODE")
        else "SLURM_TASKS_PER_NODE"
    )
    text = env.get(key, "")
    if not text:
        return _int(env, "SLURM_LOCALID", 0), world
    try:
        counts = tasks_per_node(text)
    except ValueError:
        raise TetherError(
            f"{key}={text!r} is not a SLURM tasks-per-node list (like 4 or 2(x3),1): "
            "run the script under srun, which sets it, or unset it"
        ) from None
    firsts = list(itertools.accumulate([0, *counts]))  # each node's first rank, block layout
    if "SLURM_NODEID" in env:
        node = _int(env, "SLURM_NODEID")
    else:
        node = next((i for i, first in enumerate(firsts[1:]) if rank < first), len(counts))
    if not 0 <= node < len(counts):
        raise TetherError(
            f"rank {rank} (SLURM_NODEID {env.get('SLURM_NODEID', 'unset')}) is on none of the "
            f"{len(counts)} nodes of {key}={text}: run the script under srun, which sets them "
            "for the same step"
        )
    local_rank = _int(env, "SLURM_LOCALID", rank - firsts[node])
    if not 0 <= local_rank < counts[node]:
        raise TetherError(
            f"local rank {local_rank} of rank {rank} is not one of the {counts[node]} tasks "
            f"{key}={text} gives node {node}: run the script under srun, which sets "
            "SLURM_LOCALID, SLURM_NODEID and the list for the same step"
        )
    return local_rank, counts[node]


def launcher_method() -> str | None:
    """The method ``tether launch --method M`` started this script for (TETHER_METHOD)."""
    return os.environ.get("TETHER_METHOD") or None


def set_launcher_method(method: str) -> None:
    """Tell the scripts ``tether launch`` starts which method it launched them for."""
    os.environ["TETHER_METHOD"] = method


def launcher_reports_errors() -> bool:
    """Whether ``tether launch`` started this script (TETHER_LAUNCH_REPORTS): its report gives
    each failed rank's error in one line."""
    return os.environ.get("TETHER_LAUNCH_REPORTS") == "1"


def set_launcher_reports_errors() -> None:
    """Tell the scripts ``tether launch`` starts that it reports their errors."""
    os.environ["TETHER_LAUNCH_REPORTS"] = "1"


def pin_loopback_if_local(env: DistEnv) -> None:
    """A job whose every rank is on this machine and meets on a loopback address keeps gloo on
    loopback too, so nothing listens on an external interface (unless the user chose one)."""
    local = env.local_world_size == env.world_size
    if local and env.master_addr in ("127.0.0.1", "localhost", "::1"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def server_wire_address(env: DistEnv) -> str:
    """Where a parameter server listens for its workers' connections
    (:mod:`tether.comm.wire_setup`): ``TETHER_SERVER_ADDR`` if set, else the rendezvous address
    (rank 0's node under torchrun and our launcher; 127.0.0.1 for a local run)."""
    return os.environ.get("TETHER_SERVER_ADDR") or env.master_addr
