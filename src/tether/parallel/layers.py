"""Sharded layers: column- and row-parallel ``Linear``, output- and input-channel-parallel
``Conv2d`` (Coates et al., ICML 2013; the layer pairs of Megatron-LM, Shoeybi et al. 2019).

Each is made from the user's full layer (:meth:`ShardedLayer.from_module`) and keeps this
rank's slice of its weight (and bias), under the layer's own parameter names, so the module's
``state_dict`` keys are the original's: loading a full state_dict into a sharded model takes
each rank's slice (a load hook), and :func:`tether.parallel.parallelize.full_state_dict`
gathers the slices back into the unsharded model's state_dict.

- Column-parallel ``Linear`` (output features split; ``Conv2d``: output channels): its input is
  replicated (``copy_to_shards``: identity forward, gradient summed backward) and its output is a
  :class:`~tether.parallel.dist_array.DistArray` sharded along the features (channels).
- Row-parallel ``Linear`` (input features split; ``Conv2d``: input channels): takes a sharded
  DistArray as it is (or slices a whole input: ``scatter_to_shards``), multiplies by its weight
  slice, sums the partial products over the group (``reduce_from_shards``) and adds the bias
  after the sum, so it is added once. Its output is an ordinary, replicated tensor.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tether.comm.transport import Transport
from tether.errors import TetherError
from tether.parallel.dist_array import DistArray, Layout
from tether.parallel.mappings import copy_to_shards, reduce_from_shards, scatter_to_shards

# the attributes of a Linear or Conv2d that a sharded layer keeps, with the whole layer's values
WHOLE_SIZES = ("in_features", "out_features", "in_channels", "out_channels", "kernel_size")


class _SharedGroup:
    """The group as a sharded layer holds it: shared, never copied, so a deep copy of a sharded
    model (the EASGD center, an evaluation copy) splits its layers over the same group."""

    def __init__(self, group: Transport) -> None:
        self.group = group
        self.ended = False  # the run's process group is gone (ctx.finish): no forward

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedGroup:
        return self


class ShardedLayer(nn.Module):
    """Base of the sharded layers: the group, and which dimension of each parameter is split
    (None: the parameter is whole on every rank)."""

    # parameter name -> the dimension split over the group, or None (replicated)
    split_dims: ClassVar[dict[str, int | None]]
    plan_kind: ClassVar[str]  # the plan's word for this sharding
    source: ClassVar[type[nn.Module]] = nn.Linear  # the layer type it replaces

    def __init__(self, group: Transport) -> None:
        super().__init__()
        self._shared_group = _SharedGroup(group)
        self._register_load_state_dict_pre_hook(self._slice_whole_tensors)

    @property
    def group(self) -> Transport:
        if self._shared_group.ended:
            raise TetherError(
                "this model is split over its model group (model parallelism), which "
                "ctx.finish() has ended: gather it first, on every rank before ctx.finish() "
                "(tether.parallel.full_state_dict), and load that into your unsplit model"
            )
        return self._shared_group.group

    def end(self) -> None:
        """The run is over: this layer (and every copy of it) refuses to run, in one line."""
        self._shared_group.ended = True

    @classmethod
    def from_module(cls, module: nn.Module, group: Transport) -> ShardedLayer:
        """This rank's part of ``module`` (a full layer of type ``source``)."""
        assert isinstance(module, cls.source), (cls.__name__, type(module).__name__)
        layer = cls(group)
        layer._take(module)
        layer._keep_settings(module)
        return layer

    def _keep_settings(self, module: nn.Module) -> None:
        """The layer's settings other than its parameters (a convolution's stride, ...), and
        the whole layer's sizes, which a model's own code may read (``self.fc1.in_features``):
        the sizes of the layer it replaces, not of this rank's slice."""
        for name in WHOLE_SIZES:
            if hasattr(module, name):
                setattr(self, name, getattr(module, name))

    def _take(self, module: nn.Module) -> None:
        """This rank's slice of each of ``module``'s parameters, as the same-named parameter."""
        for name, dim in self.split_dims.items():
            param = getattr(module, name, None)
            if param is None:
                self.register_parameter(name, None)
                continue
            data = param.detach()
            if dim is not None:
                step = data.shape[dim] // self.group.world_size
                data = data.narrow(dim, self.group.rank * step, step)
            self.register_parameter(
                name, nn.Parameter(data.clone(), requires_grad=param.requires_grad)
            )

    def _slice_whole_tensors(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """A whole tensor (the unsharded model's) loads as this rank's slice of it."""
        for name, dim in self.split_dims.items():
            key, param = prefix + name, getattr(self, name)
            value = state_dict.get(key)
            if dim is None or param is None or not isinstance(value, torch.Tensor):
                continue
            if value.dim() == param.dim() and value.shape[dim] == param.shape[dim] * (
                self.group.world_size
            ):
                step = param.shape[dim]
                state_dict[key] = value.narrow(dim, self.group.rank * step, step)

    def extra_repr(self) -> str:
        return f"{self.plan_kind}, rank {self.group.rank} of {self.group.world_size}"


def _whole(x: Any) -> torch.Tensor:
    return x.full() if isinstance(x, DistArray) else x


def _sliced(x: Any, group: Transport, dim: int) -> torch.Tensor:
    """This rank's slice of the input along ``dim``: a DistArray sharded so is used as it is."""
    if isinstance(x, DistArray):
        return x.shard(dim)
    return scatter_to_shards(x, group, dim)


class ColumnParallelLinear(ShardedLayer):
    """``Linear`` with its output features split: ``y_r = x W_r^T + b_r`` on rank r."""

    split_dims = {"weight": 0, "bias": 0}
    plan_kind = "column"
    weight: nn.Parameter
    bias: nn.Parameter | None

    def forward(self, x: Any) -> DistArray:
        y = F.linear(copy_to_shards(_whole(x), self.group), self.weight, self.bias)
        return DistArray(y, Layout.sharded(y.dim() - 1), self.group)


class RowParallelLinear(ShardedLayer):
    """``Linear`` with its input features split: ``y = sum_r x_r W_r^T + b``."""

    split_dims = {"weight": 1, "bias": None}
    plan_kind = "row"
    weight: nn.Parameter
    bias: nn.Parameter | None

    def forward(self, x: Any) -> torch.Tensor:
        dim = x.dim() - 1
        y = reduce_from_shards(F.linear(_sliced(x, self.group, dim), self.weight), self.group)
        return y + self.bias if self.bias is not None else y


class _ConvGeometry(ShardedLayer):
    """The ``Conv2d`` settings both conv shardings keep (``groups`` 1, zero padding)."""

    weight: nn.Parameter
    bias: nn.Parameter | None
    stride: tuple[int, ...]
    padding: Any  # a tuple of ints, or 'same' / 'valid'
    dilation: tuple[int, ...]

    source = nn.Conv2d

    def _keep_settings(self, module: nn.Module) -> None:
        assert isinstance(module, nn.Conv2d)
        super()._keep_settings(module)
        self.stride, self.padding, self.dilation = module.stride, module.padding, module.dilation

    def _conv(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.conv2d(x, self.weight, bias, self.stride, self.padding, self.dilation)


class ChannelParallelConv2d(_ConvGeometry):
    """``Conv2d`` with its output channels split (the column-parallel convolution); its output
    is a DistArray sharded along the channels."""

    split_dims = {"weight": 0, "bias": 0}
    plan_kind = "channel"

    def forward(self, x: Any) -> DistArray:
        y = self._conv(copy_to_shards(_whole(x), self.group), self.bias)
        return DistArray(y, Layout.sharded(y.dim() - 3), self.group)  # (N,) C, H, W


class InputChannelParallelConv2d(_ConvGeometry):
    """``Conv2d`` with its input channels split (the row-parallel convolution): partial sums
    over the group, the bias added after."""

    split_dims = {"weight": 1, "bias": None}
    plan_kind = "input-channel"

    def forward(self, x: Any) -> torch.Tensor:
        channels = x.dim() - 3  # (N,) C, H, W
        y = reduce_from_shards(self._conv(_sliced(x, self.group, channels), None), self.group)
        return y + self.bias.view(-1, 1, 1) if self.bias is not None else y
