"""Model parallelism's settings, in one process: the data-parallel group's node size (what the
hierarchical all-reduce and auto's calibration take), the one-line refusals, dict plans."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tether.config import TrainConfig
from tether.errors import TetherError
from tether.methods import MethodContext, Placement
from tether.methods.replicated import reducer_ranks_per_node
from tether.training.model_parallel import check_model_parallel, plan_option


def _context(workers: int, k: int, local: int | None, ranks_per_node: int = 0) -> MethodContext:
    config = TrainConfig(
        method="sync-sgd", workers=workers, model_parallel=k, ranks_per_node=ranks_per_node
    )
    data: Any = SimpleNamespace(world_size=workers // k)
    grid: Any = SimpleNamespace(world=SimpleNamespace(world_size=workers), model_parallel=k)
    return MethodContext(
        config, data, torch.device("cpu"), Placement(local), grid if k > 1 else None
    )


@pytest.mark.parametrize(
    ("workers", "k", "local", "ranks_per_node", "expected"),
    [
        (4, 2, 4, 0, 2),  # one node of 4: the data group's 2 ranks share it
        (8, 2, 4, 0, 2),  # 2 nodes of 4: 2 of a data group's 4 ranks on each
        (8, 4, 4, 0, 1),  # a node holds one model group: one data rank per node
        (8, 2, None, 4, 2),  # --ranks-per-node 4 emulates nodes of 4 ranks
        (4, 1, 2, 0, 2),  # no grid: the launcher's node size as before
    ],
)
def test_the_data_groups_node_size(workers, k, local, ranks_per_node, expected) -> None:
    assert reducer_ranks_per_node(_context(workers, k, local, ranks_per_node)) == expected


def test_a_model_group_may_not_straddle_emulated_nodes() -> None:
    config = TrainConfig(method="sync-sgd", workers=8, model_parallel=4, ranks_per_node=2)
    with pytest.raises(TetherError, match=r"ranks_per_node \(2\) must be a multiple of model"):
        check_model_parallel(config)


def test_a_dict_plan_becomes_the_configs_entries() -> None:
    assert plan_option({"fc1": "column", "fc2": "row"}) == ("fc1=column", "fc2=row")
    assert plan_option(("fc1=column",)) == ("fc1=column",)
