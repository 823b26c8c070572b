"""Driving a method by hand in tests: one cross-entropy step through the method's step seam, and
the flat gradient a reference implementation needs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tether.methods import StepTimes, TrainingMethod
from tether.methods.flat import flat_gradient


def cross_entropy_step(
    method: TrainingMethod, x: torch.Tensor, y: torch.Tensor, times: StepTimes | None = None
) -> float:
    """``zero_grad``, then the method's step with forward and backward on ``(x, y)`` as its
    closure, as the trainer drives it; returns the loss."""

    def backward() -> torch.Tensor:
        loss = F.cross_entropy(method.model(x), y)
        loss.backward()
        return loss.detach()

    method.zero_grad()
    loss = method.step(backward, times if times is not None else StepTimes())
    assert loss is not None
    return float(loss)


def loss_and_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """Forward and backward on one batch in a reference model; returns (loss, flat gradient)."""
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.detach()), flat_gradient(model)
