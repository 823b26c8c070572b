"""The one module that reads (and, for local launches, sets) environment variables.

torch's elastic launcher, ``torchrun`` and our local launcher describe a worker's place in the job
through the standard variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Everything else in Tether receives these values as arguments (DESIGN.md convention 8).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int | None
    run_id: str | None

    @staticmethod
    def read() -> DistEnv:
        """The launcher-provided placement of this process (defaults: a single process)."""
        env = os.environ
        port = env.get("MASTER_PORT")
        return DistEnv(
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1"))),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(port) if port else None,
            run_id=env.get("TORCHELASTIC_RUN_ID"),
        )

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
    """Where torch's elastic agent wants this process's structured error (``@record`` writes it),
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
    value = os.environ.get("LOCAL_WORLD_SIZE")
    return int(value) if value else None
