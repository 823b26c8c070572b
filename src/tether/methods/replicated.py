"""What the replicated methods share: every worker holds a full replica of the model, starts
from rank 0's weights, and all-reduces with the configured algorithm and wire format (sync-sgd
averages gradients every step, local-sgd parameters every tau steps, sync-easgd sums the elastic
differences every tau steps)."""

from __future__ import annotations

import torch
from torch import nn

from tether.comm.reducer import AllReducer
from tether.methods.base import MethodContext


def broadcast_parameters(model: nn.Module, transport, src: int = 0) -> None:
    """Make every replica start from rank ``src``'s weights (and buffers, e.g. batch-norm stats)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        transport.broadcast(tensor.data, src=src)


def average_buffers(model: nn.Module, transport) -> None:
    """Average floating-point buffers (batch-norm running statistics) over the replicas.

    Gradients keep the weights identical, but each replica's running statistics see only its own
    shard; averaging them before evaluation makes every replica evaluate the same model. One
    flat all-reduce, not one per buffer.
    """
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    if not buffers or transport.world_size == 1:
        return
    flat = torch.cat([b.reshape(-1) for b in buffers])
    transport.all_reduce(flat)
    flat.div_(transport.world_size)
    offset = 0
    for b in buffers:
        b.copy_(flat[offset : offset + b.numel()].view_as(b))
        offset += b.numel()


def run_reducer(context: MethodContext) -> AllReducer:
    """The all-reducer the run's ``allreduce``, ``compress`` and ``ranks_per_node`` ask for; the
    node size defaults to the launcher's (for ``hierarchical`` and ``auto``'s calibration)."""
    config, transport = context.config, context.transport
    return AllReducer(
        transport,
        config.allreduce,
        config.compress,
        reducer_ranks_per_node(context),
        cache_dir=context.placement.cache_dir,
    )


def reducer_ranks_per_node(context: MethodContext) -> int:
    """The ranks of the method's group on one node. Under model parallelism the group is a
    data-parallel one, a rank of every model group: a node of L ranks holds L/K of them, in the
    group's order (a model group's K ranks are consecutive, so on one node when K divides L)."""
    grid = context.grid
    world = grid.world.world_size if grid is not None else context.transport.world_size
    node = context.config.ranks_per_node or context.placement.ranks_on_node(world)
    if grid is None:
        return node
    return max(1, node // grid.model_parallel)


# The replicated methods' reducer settings (config keys): setting them for another method warns.
REDUCER_SETTINGS = frozenset({"allreduce", "compress", "ranks_per_node"})
