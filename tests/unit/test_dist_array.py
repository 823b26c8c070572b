"""DistArray's layout rules, in one process: which operations keep an array's layout (and send
nothing), and which make it whole first (and send what). The group is a stand-in for two ranks
that hold the same slice (its all-reduce doubles, its all-gather repeats rank 0's chunk), which
is all these rules need: the numerics against real groups are tests/distributed's."""

from __future__ import annotations

import collections
from collections import Counter
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tether.errors import TetherError
from tether.parallel import (
    PARTIAL,
    ChannelParallelConv2d,
    DistArray,
    InputChannelParallelConv2d,
    Layout,
)


class TwinGroup:
    """Rank 0 of two ranks whose slices are equal: every collective is counted."""

    rank, world_size = 0, 2

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False) -> Any:
        self.calls["all_reduce"] += 1
        tensor.mul_(2)

    def all_gather(self, tensor: torch.Tensor) -> None:
        self.calls["all_gather"] += 1
        half = tensor.numel() // 2
        tensor[half:] = tensor[:half]


def _images(group: TwinGroup) -> DistArray:
    """(N=3, C=4 of 8 channels, 4, 4) sharded along the channels."""
    return DistArray(torch.randn(3, 4, 4, 4), Layout.sharded(1), group)


@pytest.mark.parametrize(
    "op",
    [
        F.relu,
        torch.tanh,
        torch.sigmoid,
        F.gelu,
        lambda x: F.max_pool2d(x, 2),
        lambda x: F.avg_pool2d(x, 2),
        lambda x: F.adaptive_avg_pool2d(x, 1),
        lambda x: x * 0.5 + 1,
        lambda x: 2 * x - x,
        lambda x: -x,
        lambda x: x.relu(),
        lambda x: torch.flatten(x, 1),
        lambda x: x.flatten(1),
        lambda x: x.view(x.size(0), -1),
        lambda x: x.reshape(3, -1),
    ],
)
def test_what_keeps_a_channel_sharding_sends_nothing(op) -> None:
    group = TwinGroup()
    out = op(_images(group))
    assert isinstance(out, DistArray) and out.layout == Layout.sharded(1), out
    assert group.calls == Counter()


def test_what_it_is_needs_no_communication() -> None:
    group = TwinGroup()
    x = _images(group)
    assert (x.shape, x.size(1), x.dim(), len(x)) == (torch.Size([3, 8, 4, 4]), 8, 4, 3)
    assert (x.dtype, x.requires_grad) == (torch.float32, False)
    assert group.calls == Counter()


def test_a_flattened_channel_slice_is_a_feature_slice() -> None:
    group = TwinGroup()
    x = _images(group)
    flat = x.flatten(1)
    assert flat.shape == torch.Size([3, 8 * 16])  # the whole tensor's shape
    assert torch.equal(flat.local, x.local.flatten(1))


@pytest.mark.parametrize(
    "op, calls",
    [
        (lambda x: F.softmax(x, dim=1), {"all_gather": 1}),  # mixes the channels
        (lambda x: x.view(-1), {"all_gather": 1}),  # merges the batch with the channels
        (lambda x: x.flatten(0, 1), {"all_gather": 1}),
        (lambda x: x.sum(), {"all_gather": 1}),  # any other tensor method: of the whole
        (lambda x: x + torch.ones(3, 8, 4, 4), {"all_gather": 1}),
        # Python's other operators (a TypeError in every worker before): of the whole
        (lambda x: x**2, {"all_gather": 1}),
        (lambda x: 1 / (1 + x), {"all_gather": 1}),
        (lambda x: x[:, :4], {"all_gather": 1}),
        (lambda x: abs(x), {"all_gather": 1}),
        (lambda x: (x > 0).float(), {"all_gather": 1}),
        (lambda x: torch.where(x > 0, x, 0.0), {"all_gather": 2}),  # x used twice
        (lambda x: 2**x, {"all_gather": 1}),
    ],
)
def test_what_needs_the_whole_tensor_gathers_once(op, calls) -> None:
    group = TwinGroup()
    out = op(_images(group))
    assert isinstance(out, torch.Tensor)
    assert group.calls == Counter(calls)


def test_python_operators_give_the_whole_tensors_values() -> None:
    group = TwinGroup()
    local = torch.randn(3, 4, 4, 4)
    x = DistArray(local, Layout.sharded(1), group)
    whole = torch.cat([local, local], dim=1)  # what the twin group's all-gather makes
    assert torch.equal(x**2, whole**2) and torch.equal(x[:, 5], whole[:, 5])
    assert torch.equal(x > 0, whole > 0) and torch.equal(x == whole, torch.ones_like(whole).bool())
    assert torch.equal(3 % (1 + abs(x)), 3 % (1 + whole.abs()))
    assert len({x}) == 1  # still usable as a key (its == is elementwise)


def test_partial_sums_stay_partial_only_under_linear_maps() -> None:
    group = TwinGroup()
    part = DistArray(torch.ones(2, 3), PARTIAL, group)
    assert isinstance(part * 3, DistArray) and (part * 3).layout == PARTIAL
    assert isinstance(part + part, DistArray) and group.calls == Counter()
    # adding a number, or a nonlinearity, must see the sum: one all-reduce each
    assert torch.equal(part + 1, torch.full((2, 3), 3.0))
    assert torch.equal(F.relu(part), torch.full((2, 3), 2.0))
    assert group.calls == Counter({"all_reduce": 2})


def test_whole_tensors_come_back_with_their_shape() -> None:
    group = TwinGroup()
    x = _images(group)
    whole = x.full()
    assert whole.shape == (3, 8, 4, 4)
    assert torch.equal(whole[:, :4], x.local) and torch.equal(whole[:, 4:], x.local)
    assert DistArray.whole({"a": [x]})["a"][0].shape == (3, 8, 4, 4)


def test_in_place_methods_are_refused_not_lost() -> None:
    x = _images(TwinGroup())
    with pytest.raises(TetherError, match=r"x.mul_\(\) on an activation split .* x = x.mul\(...\)"):
        x.mul_(0)


def test_containers_keep_their_type() -> None:
    pair = collections.namedtuple("pair", "logits aux")
    group = TwinGroup()
    out = DistArray.whole(pair(_images(group), torch.ones(2)))
    assert type(out) is pair and out.logits.shape == (3, 8, 4, 4)
    plain = pair(torch.ones(1), torch.zeros(1))
    assert DistArray.whole(plain) is plain  # nothing to gather: the very object
    ordered = DistArray.whole(collections.OrderedDict(a=_images(group)))
    assert type(ordered) is collections.OrderedDict and ordered["a"].shape == (3, 8, 4, 4)


def test_dropout_takes_its_slice_of_the_whole_tensors_mask() -> None:
    """Every rank draws the whole tensor's mask from the same random state (as F.dropout on the
    whole tensor does) and keeps its slice: the unsharded model's result, slice by slice, and
    the random states stay equal across the ranks."""
    group = TwinGroup()
    x = _images(group)
    whole = torch.cat([x.local, x.local], dim=1)  # the twin group's whole tensor
    torch.manual_seed(3)
    ours = F.dropout(x, 0.4, training=True)
    after_ours = torch.get_rng_state()
    torch.manual_seed(3)
    theirs = F.dropout(whole, 0.4, training=True)
    assert isinstance(ours, DistArray) and ours.layout == Layout.sharded(1)
    assert torch.equal(ours.local, theirs[:, :4])
    assert torch.equal(after_ours, torch.get_rng_state())
    assert F.dropout(x, 0.4, training=False) is x and group.calls == Counter()


def test_convolution_layouts_of_batched_and_unbatched_images() -> None:
    torch.manual_seed(0)
    conv = ChannelParallelConv2d.from_module(nn.Conv2d(2, 4, 3, padding=1), TwinGroup())
    assert conv(torch.randn(5, 2, 6, 6)).layout == Layout.sharded(1)
    assert conv(torch.randn(2, 6, 6)).layout == Layout.sharded(0)
    rows = InputChannelParallelConv2d.from_module(nn.Conv2d(4, 3, 3, padding=1), TwinGroup())
    assert rows(torch.randn(4, 6, 6)).shape == (3, 6, 6)
    assert rows(torch.randn(5, 4, 6, 6)).shape == (5, 3, 6, 6)
