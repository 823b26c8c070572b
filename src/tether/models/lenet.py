"""LeNet-5 (LeCun, Bottou, Bengio and Haffner 1998), adapted to the input size.

Geometry. LeCun's network sees 32x32 inputs (MNIST's 28x28 digits padded by 2):

    conv 6@5x5 -> 28x28 -> pool 2 -> 14x14 -> conv 16@5x5 -> 10x10 -> pool 2 -> 5x5
    -> fc 120 -> fc 84 -> fc classes

Here each 5x5 convolution gets padding 2 ("same") along a dimension exactly when its input is
smaller than in the classic network (32 for the first conv, 14 for the second), and is unpadded
("valid") otherwise. This reproduces the classic geometry for 28x28 (padding 2 on conv1, as LeCun
padded the images) and for 32x32 CIFAR (no padding), and keeps tiny inputs such as 8x8 scikit-learn
digits alive (8 -> 8 -> 4 -> 4 -> 2) instead of shrinking them to nothing. The size of the first
fully connected layer follows from that arithmetic.

Modernisations, documented because they differ from the paper: ReLU instead of the scaled tanh,
max-pooling instead of trainable average sub-sampling, a full conv1->conv2 connection table
instead of the paper's partial one, and a linear output layer (trained with cross-entropy) instead
of the Euclidean RBF units. These are the choices of common modern LeNet-5 references; they train
faster. The result has 61,706 parameters on 1x28x28 with 10 classes (the paper's network, with
its partial table and RBF outputs, has about 60,000 trainable parameters).
"""

from __future__ import annotations

import torch
from torch import nn

from tether.errors import TetherError

_KERNEL = 5
# Input side lengths of conv1 and conv2 in LeCun's network; smaller inputs get "same" padding.
_CLASSIC_CONV1_INPUT = 32
_CLASSIC_CONV2_INPUT = 14


def _padding(size: int, classic: int) -> int:
    return _KERNEL // 2 if size < classic else 0


def _conv_pool(size: int, padding: int) -> int:
    """Side length after a 5x5 stride-1 convolution with ``padding`` and a 2x2 max-pool."""
    return (size + 2 * padding - _KERNEL + 1) // 2


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998, "Gradient-based learning applied to document recognition",
    Proc. IEEE 86(11)) with ReLU and max-pooling; geometry adapted to ``in_shape``.
    """

    def __init__(
        self, in_shape: tuple[int, int, int], num_classes: int, batch_norm: bool = False
    ) -> None:
        super().__init__()
        c, h, w = in_shape
        pad1 = (_padding(h, _CLASSIC_CONV1_INPUT), _padding(w, _CLASSIC_CONV1_INPUT))
        h1, w1 = _conv_pool(h, pad1[0]), _conv_pool(w, pad1[1])
        pad2 = (_padding(h1, _CLASSIC_CONV2_INPUT), _padding(w1, _CLASSIC_CONV2_INPUT))
        h2, w2 = _conv_pool(h1, pad2[0]), _conv_pool(w1, pad2[1])
        if min(h1, w1, h2, w2) < 1:
            raise TetherError(f"lenet5 needs inputs of at least 4x4 pixels, got {h}x{w}")

        # Layers in forward order (see models/base.py on why the order matters).
        def norm(layer: nn.Module, channels: int, kind: type[nn.Module]) -> list[nn.Module]:
            # The batch-norm variant normalises after each hidden layer, before the ReLU.
            return [layer, kind(channels), nn.ReLU()] if batch_norm else [layer, nn.ReLU()]

        self.features = nn.Sequential(
            *norm(nn.Conv2d(c, 6, _KERNEL, padding=pad1), 6, nn.BatchNorm2d),
            nn.MaxPool2d(2),
            *norm(nn.Conv2d(6, 16, _KERNEL, padding=pad2), 16, nn.BatchNorm2d),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            *norm(nn.Linear(16 * h2 * w2, 120), 120, nn.BatchNorm1d),
            *norm(nn.Linear(120, 84), 84, nn.BatchNorm1d),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_lenet5(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """LeNet-5 (LeCun et al. 1998) with ReLU and max-pooling, ~61.7k params on 28x28."""
    return LeNet5(in_shape, num_classes)


def build_lenet5_bn(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """LeNet-5 with batch norm after every hidden layer (the large-batch benchmarks' variant)."""
    return LeNet5(in_shape, num_classes, batch_norm=True)
