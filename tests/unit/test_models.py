"""Reference models: shapes, gradients, parameter counts, determinism and registry errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tether.errors import TetherError
from tether.models import MODELS, build_model, count_parameters

SHAPES = [(1, 28, 28), (3, 32, 32), (1, 8, 8)]


def _build(name: str, shape: tuple[int, int, int], seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(name, shape, 10)


def test_registry_lists_the_reference_models() -> None:
    assert set(MODELS.names()) == {"mlp", "lenet5", "lenet5-bn", "cnn", "resnet8"}
    for name in MODELS.names():
        assert MODELS.describe(name)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", MODELS.names())
def test_forward_and_backward(name: str, shape: tuple[int, int, int]) -> None:
    model = _build(name, shape)
    x = torch.randn(4, *shape)
    y = torch.randint(0, 10, (4,))
    out = model(x)
    assert out.shape == (4, 10)
    assert torch.isfinite(out).all()
    nn.functional.cross_entropy(out, y).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", MODELS.names())
def test_parameters_are_registered_in_forward_order(name: str) -> None:
    # Gradient buckets rely on it: first parameter eats the input, last one is the output bias.
    model = _build(name, (3, 32, 32))
    params = list(model.parameters())
    first, last = params[0], params[-1]
    assert first.shape[1] in (3, 3 * 32 * 32)
    assert last.shape == (10,)


def test_lenet5_parameter_count_on_28x28() -> None:
    # 28x28 padded by 2 gives LeCun's 32x32 geometry:
    #   conv1  1 -> 6, 5x5:        6*1*25 + 6      =    156   (28x28 -> pool -> 14x14)
    #   conv2  6 -> 16, 5x5:       16*6*25 + 16    =  2,416   (10x10 -> pool -> 5x5)
    #   fc1    16*5*5=400 -> 120:  400*120 + 120   = 48,120
    #   fc2    120 -> 84:          120*84 + 84     = 10,164
    #   fc3    84 -> 10:           84*10 + 10      =    850
    #                                        total = 61,706
    assert count_parameters(_build("lenet5", (1, 28, 28))) == 61_706
    # CIFAR 3x32x32 needs no padding; only conv1 grows: 6*3*25 + 6 = 456 (+300).
    assert count_parameters(_build("lenet5", (3, 32, 32))) == 62_006


def test_other_parameter_counts() -> None:
    # mlp on 784 inputs: 784*256+256 + 256*128+128 + 128*10+10 = 235,146.
    assert count_parameters(_build("mlp", (1, 28, 28))) == 235_146
    # resnet8, option-A shortcuts, bias-free convs: stem 432+32, block1 4,608+64,
    # block2 13,824+128, block3 55,296+256, fc 650 -> 75,290.
    assert count_parameters(_build("resnet8", (3, 32, 32))) == 75_290
    n = count_parameters(_build("cnn", (3, 32, 32)))
    assert 1_000_000 < n < 10_000_000
    # convs 555,328 + fc 4,096*1,024+1,024 + fc 1,024*10+10 = 4,760,906.
    assert n == 4_760_906


@pytest.mark.parametrize("name", MODELS.names())
def test_same_seed_gives_identical_parameters(name: str) -> None:
    a = _build(name, (1, 28, 28), seed=1234).state_dict()
    b = _build(name, (1, 28, 28), seed=1234).state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    c = _build(name, (1, 28, 28), seed=1235).state_dict()
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(TetherError) as info:
        build_model("alexnet9000", (1, 28, 28), 10)
    message = str(info.value)
    assert "alexnet9000" in message
    for name in MODELS.names():
        assert name in message


@pytest.mark.parametrize(("shape", "classes"), [((28, 28), 10), ((1, 0, 28), 10), ((1, 28, 28), 0)])
def test_bad_shapes_are_user_errors(shape: Any, classes: int) -> None:
    with pytest.raises(TetherError):
        build_model("mlp", shape, classes)


def test_lenet5_rejects_inputs_too_small_for_two_pools() -> None:
    with pytest.raises(TetherError, match="at least 4x4"):
        build_model("lenet5", (1, 3, 3), 10)
    build_model("lenet5", (1, 4, 4), 10)
