"""A spawned group shared by the modules that need 4 ranks: starting one costs seconds on a
2-core machine (4 processes importing torch, and torch._dynamo with their first optimizer), so
test_sync_sgd.py (its 4-rank case), test_two_level_easgd.py, test_shard_resume.py and
test_model_parallel.py run their ranks' parts in one group, one part after the other, and each
module checks its part's results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tether.launch.spawn import run_spawned

FOUR = 4


def _on_four_ranks(rank: int, world: int, root: str) -> dict[str, Any]:
    from tests.distributed import (
        test_model_parallel,
        test_shard_resume,
        test_sync_sgd,
        test_two_level_easgd,
    )

    return {
        "sync-sgd": test_sync_sgd.on_every_rank(rank, world),
        "two-level": test_two_level_easgd.on_every_rank(rank, world),
        "shard-resume": test_shard_resume.on_every_rank(rank, world, root),
        "model-parallel": test_model_parallel.on_every_rank(rank, world),
    }


@pytest.fixture(scope="session")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    """Every rank's results of every part, and the directory the parts wrote their runs to."""
    root = tmp_path_factory.mktemp("four-ranks")
    return run_spawned(_on_four_ranks, FOUR, str(root), timeout_s=30), root
