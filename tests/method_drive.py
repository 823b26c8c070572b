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


class RecordingHooks:
    """A server's hooks for tests: every global step and worker loss report is kept; the run
    stops once the global step reaches ``stop_at`` (None: never)."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.stop_at = stop_at
        self.seen: list[int] = []
        self.losses: list[tuple[int, int, float, int, int | None]] = []

    def on_progress(self, global_step: int, consistent: bool = True) -> bool:
        del consistent
        self.seen.append(global_step)
        return self.stop_at is not None and global_step >= self.stop_at

    def on_worker_loss(
        self, rank: int, worker_step: int, loss: float, steps: int, global_step: int | None = None
    ) -> None:
        self.losses.append((rank, worker_step, loss, steps, global_step))
