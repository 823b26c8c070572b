"""The model registry, the builder protocol and small helpers shared by every reference model.

A model builder takes the input shape ``(C, H, W)`` and the number of classes and returns a plain
``torch.nn.Module`` (Tether wraps models, it does not replace them). Builders never
seed: the caller calls ``torch.manual_seed`` first, so that every worker builds identical
parameters and a run is reproducible.

Every model registers its layers in forward order. This matters beyond tidiness: gradient buckets
are filled in reverse registration order, which is then (roughly) the order in which backward
produces gradients, so a bucket's all-reduce can start while backward is still running.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from tether.errors import TetherError
from tether.models.cnn import build_cnn
from tether.models.lenet import build_lenet5, build_lenet5_bn
from tether.models.mlp import build_mlp
from tether.models.resnet import build_resnet8
from tether.registry import Registry

ModelBuilder = Callable[[tuple[int, int, int], int], nn.Module]
"""``(in_shape, num_classes) -> nn.Module`` with ``in_shape = (C, H, W)``."""

MODELS: Registry[ModelBuilder] = Registry("model")
MODELS.register("mlp")(build_mlp)
MODELS.register("lenet5")(build_lenet5)
MODELS.register("lenet5-bn")(build_lenet5_bn)
MODELS.register("cnn")(build_cnn)
MODELS.register("resnet8")(build_resnet8)


def build_model(name: str, in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Build the registered model ``name`` for inputs of shape ``(C, H, W)``.

    Raises :class:`TetherError` for an unknown name (listing the valid ones), a malformed input
    shape, or fewer than one class. Seed with ``torch.manual_seed`` before calling.
    """
    builder = MODELS.get(name)
    shape = tuple(in_shape)
    if len(shape) != 3 or not all(isinstance(d, int) and d > 0 for d in shape):
        raise TetherError(
            f"model {name!r} needs an input shape (C, H, W) of three positive integers, "
            f"got {in_shape!r}"
        )
    if not isinstance(num_classes, int) or num_classes < 1:
        raise TetherError(f"model {name!r} needs num_classes >= 1, got {num_classes!r}")
    c, h, w = shape
    return builder((c, h, w), num_classes)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (shared parameters counted once; buffers excluded)."""
    return sum(p.numel() for p in model.parameters())
