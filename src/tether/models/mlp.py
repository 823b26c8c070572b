"""A multi-layer perceptron: the smallest reference model, for fast tests and sanity runs."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Flatten -> 256 -> 128 -> ``num_classes`` with ReLU.

    The classic fully connected baseline of the MNIST literature (cf. LeCun et al. 1998, "Gradient-
    based learning applied to document recognition", Proc. IEEE 86(11), which tabulates such
    nets). 235,146 parameters on 1x28x28 with 10 classes.
    """

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, int] = (256, 128)):
        super().__init__()
        h1, h2 = hidden
        # One Sequential keeps parameters in forward order (see models/base.py).
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, h1),
            nn.ReLU(),
            nn.Linear(h1, h2),
            nn.ReLU(),
            nn.Linear(h2, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build_mlp(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """MLP: flatten -> 256 -> 128 -> classes, ReLU."""
    c, h, w = in_shape
    return MLP(c * h * w, num_classes)
