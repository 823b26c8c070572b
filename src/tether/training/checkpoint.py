"""Checkpoints: written atomically, loaded with ``weights_only=True`` (no arbitrary unpickling).

A checkpoint holds the model weights, the method's state (optimizer momentum, and later the center
variable), the global step, the run's history so far and the random state (torch's, Python's and
NumPy's generators: dropout, a user's augmentation; see training.random_state), so that
``--resume`` continues exactly: the data order depends only on (seed, step), so nothing else is
needed for sync-sgd.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tether.errors import TetherError
from tether.observe.files import atomic_write

CHECKPOINT_NAME = "checkpoint.pt"
# Methods whose replicas differ between synchronisations also save every rank's own replica and
# optimizer here (rank-R.pt), before rank 0 writes CHECKPOINT_NAME, which names how many there are.
SHARDS_DIR = "checkpoint-ranks"


def shard_path(run_dir: Path, rank: int) -> Path:
    return run_dir / SHARDS_DIR / f"rank-{rank}.pt"


def save_shard(run_dir: Path, rank: int, state: dict[str, Any]) -> None:
    atomic_write(shard_path(run_dir, rank), lambda handle: torch.save(state, handle))


def load_shard(run_dir: Path, rank: int, step: int | None) -> dict[str, Any] | None:
    """This rank's shard of the checkpoint at ``step`` (None: of any step); None when there is
    none of that step."""
    path = shard_path(run_dir, rank)
    if not path.exists():
        return None
    try:
        shard = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a torn or foreign file: resume as without shards
        return None
    if not isinstance(shard, dict) or (step is not None and shard.get("step") != step):
        return None
    return shard


def save_checkpoint(
    run_dir: Path, state: dict[str, Any], progress: Callable[[], None] | None = None
) -> Path:
    """``progress``: called as the bytes reach the file (a server's workers hear it is busy)."""
    path = run_dir / CHECKPOINT_NAME
    atomic_write(path, lambda handle: torch.save(state, handle), progress)
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    path = run_dir / CHECKPOINT_NAME
    if not path.exists():
        raise TetherError(
            f"no checkpoint in {run_dir}: resume needs a run started with --checkpoint-every N "
            "(checkpoint_every=N in Python)"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say which, not a pickle traceback
        raise TetherError(f"cannot load checkpoint {path}: {exc}") from None
