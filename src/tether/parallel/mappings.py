"""The autograd-aware collectives behind the sharded layers, in their four conjugate pairs.

Model parallelism (Coates, Huval, Wang, Wu, Ng, Catanzaro, "Deep learning with COTS HPC
systems", ICML 2013) splits a layer's neurons over the ranks of a model group, so activations,
not weights, cross the wire. Each movement of an activation has a conjugate movement of its
gradient, and the pairs are those of Megatron-LM's mappings (Shoeybi et al. 2019) and of
PyTorch's ColwiseParallel / RowwiseParallel styles:

============================  ==========================  ============================
mapping                       forward                     backward
============================  ==========================  ============================
:func:`copy_to_shards`        identity                    all-reduce (sum)
:func:`reduce_from_shards`    all-reduce (sum)            identity
:func:`gather_from_shards`    all-gather along ``dim``    keep this rank's slice
:func:`scatter_to_shards`     keep this rank's slice      all-gather along ``dim``
============================  ==========================  ============================

A column-parallel layer's input goes through ``copy_to_shards`` (each rank's output columns
contribute only part of the input's gradient: the parts are summed in backward), a
row-parallel layer's partial output through ``reduce_from_shards``; a column -> row pair thus
costs one all-reduce of the activations forward and one backward.

Every collective runs on a :class:`~tether.comm.transport.Transport` (the model group's), whose
``all_gather`` fills a flat vector chunk by chunk; the slices here are equal (the sharded sizes
are multiples of the group size: :mod:`tether.parallel.plan` checks it), so chunk ``r`` of the
flat vector is exactly rank ``r``'s slice.
"""

from __future__ import annotations

from typing import Any

import torch

from tether.comm.transport import Transport


def all_reduce_sum(tensor: torch.Tensor, group: Transport) -> torch.Tensor:
    """A new tensor: the sum of ``tensor`` over the group (the input is left as it is)."""
    out = tensor.contiguous().clone()
    group.all_reduce(out)
    return out


def all_gather_dim(tensor: torch.Tensor, group: Transport, dim: int) -> torch.Tensor:
    """The ranks' equal slices of a tensor, concatenated along ``dim`` in rank order."""
    size, rank = group.world_size, group.rank
    local = tensor.contiguous()
    n = local.numel()
    flat = local.new_empty(size * n)
    flat[rank * n : (rank + 1) * n] = local.reshape(-1)
    group.all_gather(flat)
    return torch.cat(flat.view(size, *local.shape).unbind(0), dim=dim)


def split_dim(tensor: torch.Tensor, group: Transport, dim: int) -> torch.Tensor:
    """This rank's slice of ``tensor`` along ``dim`` (one of ``world_size`` equal slices)."""
    length = tensor.shape[dim]
    assert length % group.world_size == 0, f"{length} does not split into {group.world_size}"
    step = length // group.world_size
    return tensor.narrow(dim, group.rank * step, step).contiguous()


class _CopyToShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Transport) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_reduce_sum(grad, ctx.group), None


class _ReduceFromShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Transport) -> torch.Tensor:
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Transport, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return all_gather_dim(x, group, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return split_dim(grad, ctx.group, ctx.dim), None, None


class _ScatterToShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Transport, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return split_dim(x, group, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return all_gather_dim(grad, ctx.group, ctx.dim), None, None


def copy_to_shards(x: torch.Tensor, group: Transport) -> torch.Tensor:
    """Identity forward, all-reduce backward: the replicated input of a column-parallel layer."""
    return _CopyToShards.apply(x, group)


def reduce_from_shards(x: torch.Tensor, group: Transport) -> torch.Tensor:
    """All-reduce forward, identity backward: the partial sums of a row-parallel layer."""
    return _ReduceFromShards.apply(x, group)


def gather_from_shards(x: torch.Tensor, group: Transport, dim: int) -> torch.Tensor:
    """All-gather forward, split backward: a sharded activation made whole."""
    return _GatherFromShards.apply(x, group, dim % x.dim())


def scatter_to_shards(x: torch.Tensor, group: Transport, dim: int) -> torch.Tensor:
    """Split forward, all-gather backward: a replicated activation cut for a row-parallel
    layer."""
    return _ScatterToShards.apply(x, group, dim % x.dim())
