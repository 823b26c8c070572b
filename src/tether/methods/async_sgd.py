"""async-sgd: parameter-server SGD, first come, first served (Dean et al. 2012, "Downpour").

A worker computes a gradient at the weights it last received (averaged over ``tau`` batches when
``tau > 1``), pushes it as one message, and receives the current weights in reply. The server
applies each gradient on arrival, one at a time: ``w <- w - lr * g``. A gradient computed on weights
more than ``--staleness-bound`` updates old is dropped (counted in summary.json) and the worker just
gets fresh weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tether.comm.header import MessageKind
from tether.methods.base import MethodContext, StepTimes
from tether.methods.local_step import loss_and_gradient
from tether.methods.ps_method import ServeResult, ServerHooks, ServerMethod
from tether.methods.registry import METHODS


@METHODS.register("async-sgd", help="parameter-server SGD, first-come-first-served")
class AsyncSGD(ServerMethod):
    """Default lr 0.1: fastest to 85% test accuracy on LeNet-5 / Fashion-MNIST, 4 workers,
    13.5-17.7 s against 17.9-21.3 s at 0.05; 0.2 did not reach it in 4 epochs and 0.4 diverged
    (benchmarks/results/method_defaults_sweep.md).
    """

    name = "async-sgd"
    defaults = {"lr": 0.1}

    def __init__(self, model: nn.Module, context: MethodContext) -> None:
        super().__init__(model, context)
        self.tau = self.config.tau
        self.accumulated = torch.zeros_like(self.flat)
        # Server: the version of the weights, and the version each worker last received.
        self.version = 0
        self.sent_version = dict.fromkeys(range(1, self.transport.world_size), 0)
        self.dropped = 0

    # -- worker ----------------------------------------------------------------------------------
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor, times: StepTimes) -> float:
        start = self.clock()
        loss, grad = loss_and_gradient(self.model, inputs, targets)
        self.accumulated.add_(grad)
        self.local_step += 1
        times.compute_s += self.clock() - start
        if self.local_step % self.tau == 0:
            start = self.clock()
            self.accumulated.div_(self.tau)
            weights = self.link.exchange(self.accumulated, MessageKind.GRADIENT, self.local_step)
            if weights is not None:
                self.flat.copy_(weights)
            self.accumulated.zero_()
            times.waited(start, self.clock())
        return loss

    # -- server ----------------------------------------------------------------------------------
    def apply_gradient(self, grad: torch.Tensor) -> None:
        """The server's update rule: ``w <- w - lr * (g + wd * w)``."""
        if self.config.weight_decay:
            grad.add_(self.flat, alpha=self.config.weight_decay)
        self.flat.sub_(grad, alpha=self.config.lr)

    def serve(self, hooks: ServerHooks) -> ServeResult:
        bound = self.config.staleness_bound

        def update(msg) -> None:
            staleness = self.version - self.sent_version[msg.header.sender]
            if bound is not None and staleness > bound:
                self.dropped += 1
                return
            self.apply_gradient(msg.payload)
            self.version += 1

        def remember(msg) -> None:
            self.sent_version[msg.header.sender] = self.version

        rounds = self.serve_loop(hooks, self.server.arrivals_fcfs(), update, remember)
        return self.result(rounds=rounds, stale_gradients_dropped=self.dropped, tau=self.tau)

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state.get("version", 0))
