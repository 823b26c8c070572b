"""Model parallelism (Coates et al., "Deep learning with COTS HPC systems", ICML 2013): sharded
layers behind a distributed array, a data x model process grid, and the sharding of a user's own
model by layer names. See docs/parallel.md."""

from tether.parallel.dist_array import PARTIAL, REPLICATED, DistArray, Layout
from tether.parallel.grid import ProcessGrid, check_grid
from tether.parallel.layers import (
    ChannelParallelConv2d,
    ColumnParallelLinear,
    InputChannelParallelConv2d,
    RowParallelLinear,
    ShardedLayer,
)
from tether.parallel.mappings import (
    copy_to_shards,
    gather_from_shards,
    reduce_from_shards,
    scatter_to_shards,
)
from tether.parallel.parallelize import (
    full_state_dict,
    is_parallel,
    parallelize,
    sharded_layers,
    whole_tensors,
)
from tether.parallel.plan import KINDS, check_plan, parse_plan, shardable_layers

__all__ = [
    "KINDS",
    "PARTIAL",
    "REPLICATED",
    "ChannelParallelConv2d",
    "ColumnParallelLinear",
    "DistArray",
    "InputChannelParallelConv2d",
    "Layout",
    "ProcessGrid",
    "RowParallelLinear",
    "ShardedLayer",
    "check_grid",
    "check_plan",
    "copy_to_shards",
    "full_state_dict",
    "gather_from_shards",
    "is_parallel",
    "parallelize",
    "parse_plan",
    "reduce_from_shards",
    "scatter_to_shards",
    "shardable_layers",
    "sharded_layers",
    "whole_tensors",
]
