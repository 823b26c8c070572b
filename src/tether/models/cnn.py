"""A small VGG-style CNN (Simonyan and Zisserman 2015) of about 4.8 M parameters.

Its job is to be communication-heavy: most of its parameters sit in one large fully connected
layer, so data-parallel methods move megabytes per step while the compute stays modest. It has no
batch normalisation on purpose: BN's running statistics are buffers, not parameters, and would make
EASGD's weight averaging (and any comparison of averaged against single-process models) unclean.
No dropout either, so a forward pass is a deterministic function of the parameters, which the
N-worker-versus-one-process oracle tests rely on.
"""

from __future__ import annotations

import torch
from torch import nn

# The feature map is brought to 4x4 before the classifier whatever the input size, so the
# parameter count (and therefore the communication volume) barely depends on the data set.
_POOLED = 4


def _conv(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()]


def _pool() -> nn.Module:
    # ceil_mode keeps odd and 1-pixel maps alive (7 -> 4, 1 -> 1), so 28x28 and 8x8 inputs work.
    return nn.MaxPool2d(2, ceil_mode=True)


class SmallCNN(nn.Module):
    """conv3x3 64-64-pool-128-128-pool-256-pool, fc 1024, fc classes; ReLU.

    VGG-style stacks of 3x3 convolutions (Simonyan and Zisserman 2015, "Very deep convolutional
    networks for large-scale image recognition", ICLR) at CIFAR scale, with He et al. 2015
    ("Delving deep into rectifiers", ICCV) initialisation for the ReLU layers. 4,760,906
    parameters on 3x32x32 with 10 classes.
    """

    def __init__(self, in_channels: int, num_classes: int, hidden: int = 1024) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv(in_channels, 64),
            *_conv(64, 64),
            _pool(),
            *_conv(64, 128),
            *_conv(128, 128),
            _pool(),
            *_conv(128, 256),
            _pool(),
            # Identity on 32x32 and 28x28 inputs (both reach 4x4); replicates smaller maps.
            nn.AdaptiveAvgPool2d(_POOLED),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(256 * _POOLED * _POOLED, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )
        # Without batch norm, PyTorch's default init shrinks the signal ~6x in variance per ReLU
        # layer, and seven of them leave almost no gradient; He init keeps every ReLU layer at
        # scale (fan_out for convs, as in torchvision's VGG/ResNet; He et al. show either mode
        # works). The output layer keeps PyTorch's smaller default so the initial loss is near
        # log(num_classes). VGG's own N(0, 0.01) for the fc layers trains far slower here.
        for m in self.features:
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                assert m.bias is not None
                nn.init.zeros_(m.bias)
        hidden_fc = self.classifier[1]
        assert isinstance(hidden_fc, nn.Linear)
        nn.init.kaiming_normal_(hidden_fc.weight, nonlinearity="relu")
        nn.init.zeros_(hidden_fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_cnn(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Small VGG-style CNN, ~4.8M params, no batch norm (communication-heavy benchmarks)."""
    return SmallCNN(in_shape[0], num_classes)
