"""async-msgd: async-sgd whose server keeps a velocity (momentum SGD on the server).

Server update on each arrival: ``v <- mu*v - lr*g``, ``w <- w + v`` (SC17's Async MSGD baseline).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tether.methods.async_sgd import AsyncSGD
from tether.methods.base import MethodContext
from tether.methods.registry import METHODS


@METHODS.register("async-msgd", help="parameter-server SGD with momentum on the server")
class AsyncMSGD(AsyncSGD):
    """Default lr 0.01 (momentum 0.9 on stale gradients needs a small lr): fastest to 85% test
    accuracy on LeNet-5 / Fashion-MNIST, 4 workers, 21.3-22.3 s against 26.0-30.6 s at 0.005;
    0.002 and 0.02 did not reach it in 4 epochs (benchmarks/results/method_defaults_sweep.md).
    """

    name = "async-msgd"
    defaults = {"lr": 0.01}

    def __init__(self, model: nn.Module, context: MethodContext) -> None:
        super().__init__(model, context)
        self.velocity = torch.zeros_like(self.flat)

    def apply_gradient(self, grad: torch.Tensor) -> None:
        if self.config.weight_decay:
            grad.add_(self.flat, alpha=self.config.weight_decay)
        self.velocity.mul_(self.config.momentum).sub_(grad, alpha=self.config.lr)
        self.flat.add_(self.velocity)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "velocity": self.velocity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "velocity" in state:
            self.velocity.copy_(state["velocity"])
