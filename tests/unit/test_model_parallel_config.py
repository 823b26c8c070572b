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


class _OneRank:
    """A model group of one rank (the collectives leave tensors as they are)."""

    rank, world_size = 0, 1

    def all_reduce(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        del tensor

    def all_gather(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        del tensor


def test_a_split_layer_keeps_the_whole_sizes_and_refuses_to_run_once_the_run_ended() -> None:
    import copy

    from tether.parallel.layers import ChannelParallelConv2d, ColumnParallelLinear

    group: Any = _OneRank()
    linear = ColumnParallelLinear.from_module(torch.nn.Linear(12, 8), group)
    conv = ChannelParallelConv2d.from_module(torch.nn.Conv2d(3, 4, 5), group)
    # a model's own code reads them (x.view(-1, self.fc1.in_features)): an AttributeError before
    assert (linear.in_features, linear.out_features) == (12, 8)
    assert (conv.in_channels, conv.out_channels, conv.kernel_size) == (3, 4, (5, 5))
    copied = copy.deepcopy(linear)  # an evaluation copy, the EASGD center
    linear(torch.ones(2, 12))
    linear.end()  # ctx.finish(): the group is gone (before: torch's "Default process group...")
    for layer in (linear, copied):
        with pytest.raises(TetherError, match=r"^this model is split over its model group"):
            layer(torch.ones(2, 12))


def test_a_method_without_model_parallelism_is_refused_before_the_worker_count() -> None:
    # Before: "model_parallel (2) must divide the 3 workers", and once the count was fixed,
    # the method's own refusal.
    from tether.catalog import resolve_config

    overrides = {"method": "async-easgd", "workers": 3, "model_parallel": 2}
    with pytest.raises(TetherError, match=r"^async-easgd does not run with model parallelism"):
        resolve_config(overrides=overrides)


def test_a_lazy_layer_in_the_plan_is_refused_before_launch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The probe's forward made the LazyLinear a Linear before the plan was checked: the check
    # passed, and every worker failed (exit 1) on the fresh model.
    import tether

    lazy = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    data = torch.utils.data.TensorDataset(torch.randn(64, 6), torch.randint(0, 2, (64,)))
    with pytest.raises(TetherError, match=r"LazyLinear"):
        tether.fit(model=lambda: lazy, train_data=data, method="sync-sgd", workers=2,
                   model_parallel=2, parallel_plan={"0": "column", "2": "row"}, steps=1,
                   out=tmp_path / "never")  # fmt: skip
