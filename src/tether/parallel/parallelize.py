"""Shard a user's own model by layer names, and put its state_dict back together.

``parallelize(model, {"fc1": "column", "fc2": "row"}, group)`` replaces the named layers of the
model in place by their sharded counterparts (:mod:`tether.parallel.layers`), each keeping this
rank's slice of the original weights. Nothing else of the model changes: its forward code runs
as written, the activations between sharded layers travel as
:class:`~tether.parallel.dist_array.DistArray` objects, and the model's output is always a whole
tensor (a hook on the model makes it so), which the user's loss and metrics take as they are.

Every rank of the group starts from group rank 0's full model (broadcast before slicing): the
slices then reproduce that one initialisation exactly. The ranks also take one random state
(group rank 0 draws a seed and every rank of the group seeds torch with it): a random layer
outside the split ones (dropout on the input, on a row layer's whole output) then draws the same
numbers on every rank of the group, which holds one model (with seeds of their own, unseeded
ranks included, its replicated parts drifted apart: each rank dropped other units). Dropout on
a split activation then draws the same pattern on every shard (Megatron keeps a second, per-rank
random state for those; not done here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from tether.comm.transport import Transport
from tether.parallel.dist_array import DistArray
from tether.parallel.layers import ShardedLayer
from tether.parallel.mappings import all_gather_dim
from tether.parallel.plan import check_plan, find_layer, layer_class


def parallelize(model: nn.Module, plan: Mapping[str, str], group: Transport) -> nn.Module:
    """Split the layers ``plan`` names over ``group`` (the model group), in place; returns the
    model. A group of one leaves it as it is."""
    check_plan(model, plan, group.world_size)
    if group.world_size == 1:
        return model
    # Every rank of the group takes group rank 0's full model first: what the plan does not
    # split (a row layer's bias, the other layers) is then one model, not one per rank, and the
    # slices are of one initialisation, whether or not the ranks seeded alike
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            group.broadcast(tensor.data, src=0)
    share_random_state(group)
    for name, kind in plan.items():
        module = find_layer(model, name)
        sharded = layer_class(name, module, kind, group.world_size).from_module(module, group)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, sharded)
    model.register_forward_hook(_whole_output)
    return model


def share_random_state(group: Transport) -> None:
    """Seed torch alike on every rank of ``group``, with a seed group rank 0 draws from its own
    generator (so model groups seeded apart stay apart)."""
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)
    group.broadcast(seed, src=0)
    torch.manual_seed(int(seed))


def _whole_output(module: nn.Module, args: Any, output: Any) -> Any:
    return DistArray.whole(output)


def sharded_layers(model: nn.Module) -> dict[str, ShardedLayer]:
    return {n: m for n, m in model.named_modules() if isinstance(m, ShardedLayer)}


def is_parallel(model: nn.Module) -> bool:
    return bool(sharded_layers(model))


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model's state_dict: every split parameter gathered from its group.
    Collective: every rank of each model group calls it, in the same order."""
    return whole_tensors(model, model.state_dict())


def whole_tensors(model: nn.Module, tensors: dict[str, Any]) -> dict[str, Any]:
    """``tensors`` (named like the model's parameters: its state_dict, its gradients) with the
    split parameters' entries gathered into whole tensors. Collective, like
    :func:`full_state_dict`."""
    out = dict(tensors)
    for prefix, layer in sharded_layers(model).items():
        for name, dim in layer.split_dims.items():
            key = f"{prefix}.{name}"
            if dim is not None and out.get(key) is not None:
                out[key] = all_gather_dim(out[key], layer.group, dim)
    return out
