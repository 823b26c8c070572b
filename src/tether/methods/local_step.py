"""A worker's local step on its flat parameter vector: plain SGD, or EAMSGD's Nesterov momentum.

Between communications every EASGD-family worker takes local steps
``x <- x - lr * g(x)`` (Zhang, Choromanska, LeCun, NIPS 2015, Algorithm 1), or, for the momentum
variant (EAMSGD, Algorithm 2), the Nesterov form ``v <- mu*v - lr*g(x + mu*v); x <- x + v``, with
the gradient taken at the look-ahead point. Both work directly on the flat vector that the model's
parameters are views of (:mod:`tether.methods.flat`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tether.methods.flat import flat_gradient


def loss_backward(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Forward and backward on one batch, gradients left in ``.grad``; returns the loss."""
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(inputs), targets)
    loss.backward()
    return float(loss.detach())


def loss_and_gradient(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor):
    """Forward and backward on one batch; returns (loss, flat gradient)."""
    loss = loss_backward(model, inputs, targets)
    return loss, flat_gradient(model)


class PlainStep:
    """``x <- x - lr * (g(x) + wd * x)``."""

    def __init__(self, flat: torch.Tensor, lr: float, weight_decay: float = 0.0) -> None:
        self.flat, self.lr, self.weight_decay = flat, lr, weight_decay

    def step(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        loss, grad = loss_and_gradient(model, inputs, targets)
        if self.weight_decay:
            grad.add_(self.flat, alpha=self.weight_decay)
        self.flat.sub_(grad, alpha=self.lr)
        return loss

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        del state


class NesterovStep:
    """EAMSGD's local step: gradient at the look-ahead point ``x + mu*v``, then
    ``v <- mu*v - lr*g``, ``x <- x + v``."""

    def __init__(
        self, flat: torch.Tensor, lr: float, momentum: float, weight_decay: float = 0.0
    ) -> None:
        self.flat, self.lr, self.mu, self.weight_decay = flat, lr, momentum, weight_decay
        self.velocity = torch.zeros_like(flat)

    def step(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        self.flat.add_(self.velocity, alpha=self.mu)  # the model now sits at x + mu*v
        loss, grad = loss_and_gradient(model, inputs, targets)
        if self.weight_decay:
            grad.add_(self.flat, alpha=self.weight_decay)
        self.flat.sub_(self.velocity, alpha=self.mu)  # back to x
        self.velocity.mul_(self.mu).sub_(grad, alpha=self.lr)
        self.flat.add_(self.velocity)
        return loss

    def state_dict(self) -> dict:
        return {"velocity": self.velocity}

    def load_state_dict(self, state: dict) -> None:
        self.velocity.copy_(state["velocity"])
