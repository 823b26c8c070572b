"""ResNet-8: the smallest member of He et al.'s CIFAR ResNet family (6n+2 layers with n = 1).

Kaiming He, Xiangyu Zhang, Shaoqing Ren and Jian Sun, "Deep residual learning for image
recognition", CVPR 2016, section 4.2: a 3x3 conv stem with 16 filters, three stages of basic
blocks with 16, 32 and 64 filters (the last two halving the resolution), global average pooling
and a fully connected classifier. Shortcuts that change shape use the paper's CIFAR "option A"
(subsample and zero-pad the channels), which has no parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    # No bias: the batch norm that follows has its own shift.
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus a shortcut (He et al. 2016, figure 2 left)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(c_in, c_out, stride)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = _conv3x3(c_out, c_out)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.stride = stride
        self.extra_channels = c_out - c_in

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        # Option A: x[::2, ::2] has ceil(n/2) pixels, as does the stride-2 padded conv, so the
        # shapes agree for odd sizes too (7x7 -> 4x4 on 28x28 inputs).
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.extra_channels:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet (He et al. 2016, section 4.2) with ``blocks_per_stage`` basic blocks per stage.

    ``blocks_per_stage=1`` is ResNet-8 (75,290 parameters on 3x32x32 with 10 classes).
    """

    def __init__(self, in_channels: int, num_classes: int, blocks_per_stage: int = 1) -> None:
        super().__init__()
        widths = (16, 32, 64)
        # Attributes are assigned in forward order, so parameters register in forward order.
        self.conv = _conv3x3(in_channels, widths[0])
        self.bn = nn.BatchNorm2d(widths[0])
        blocks: list[nn.Module] = []
        c_in = widths[0]
        for stage, width in enumerate(widths):
            for i in range(blocks_per_stage):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(c_in, width, stride))
                c_in = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c_in, num_classes)
        # The paper initialises as in He et al. 2015 ("Delving deep into rectifiers").
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn(self.conv(x)))
        out = self.blocks(out)
        out = torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)
        return self.fc(out)


def build_resnet8(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """ResNet-8 (He et al. 2016, CIFAR variant), 16/32/64 channels, batch norm, ~75k params."""
    return ResNet(in_shape[0], num_classes, blocks_per_stage=1)
