"""Elastic Averaging SGD with a center-variable server: the shared part of original-easgd,
async-easgd and async-measgd (You, Buluc, Demmel, SC17, section 4; Zhang et al., NIPS 2015).

Every ``tau`` local steps worker i sends its flat weights ``x_i`` (one message); the server computes
``d = x_i - c`` with its current center, replies with that same ``c``, and then moves the center
``c <- c + alpha*d``; the worker moves ``x_i <- x_i - alpha*d``. The methods differ only in the order
the server serves workers (round-robin or first come, first served) and in the worker's local step.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from tether.comm.header import MessageKind
from tether.config import TrainConfig
from tether.methods.base import MethodContext, StepTimes
from tether.methods.local_step import NesterovStep, PlainStep
from tether.methods.ps_method import ServeResult, ServerHooks, ServerMethod


def elastic_rate(config: TrainConfig, workers: int) -> float:
    """``alpha``: given directly, or ``lr * rho``, or the EASGD paper's ``beta = P*alpha = 0.9``."""
    if config.alpha is not None:
        return config.alpha
    if config.rho is not None:
        return config.lr * config.rho
    return 0.9 / workers


def elastic_worker_update(x: torch.Tensor, center: torch.Tensor, alpha: float) -> None:
    """``x <- x - alpha * (x - c)``, in place."""
    x.sub_(x - center, alpha=alpha)


class ElasticServerMethod(ServerMethod):
    """EASGD with the center on a server; subclasses choose the service order and local step."""

    round_robin: ClassVar[bool] = False
    local_momentum: ClassVar[bool] = False

    def __init__(self, model: nn.Module, context: MethodContext) -> None:
        super().__init__(model, context)
        config = self.config
        self.alpha = elastic_rate(config, self.computing_workers())
        self.tau = config.tau
        if self.local_momentum:
            self.local: PlainStep | NesterovStep = NesterovStep(
                self.flat, config.lr, config.momentum, config.weight_decay
            )
        else:
            self.local = PlainStep(self.flat, config.lr, config.weight_decay)

    # -- worker ----------------------------------------------------------------------------------
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor, times: StepTimes) -> float:
        start = self.clock()
        loss = self.local.step(self.model, inputs, targets)
        self.local_step += 1
        times.compute_s += self.clock() - start
        if self.local_step % self.tau == 0:
            start = self.clock()
            center = self.link.exchange(self.flat, MessageKind.PARAMS, self.local_step)
            if center is not None:
                elastic_worker_update(self.flat, center, self.alpha)
            times.waited(start, self.clock())
        return loss

    # -- server ----------------------------------------------------------------------------------
    def serve(self, hooks: ServerHooks) -> ServeResult:
        server = self.server
        arrivals = server.arrivals_round_robin() if self.round_robin else server.arrivals_fcfs()
        center = self.flat

        def difference(msg) -> None:  # d = x_i - c, computed in the arrival's own buffer
            msg.payload.sub_(center)

        def move_center(msg) -> None:  # after the reply: the worker got the c that made d
            center.add_(msg.payload, alpha=self.alpha)

        rounds = self.serve_loop(hooks, arrivals, difference, move_center)
        return self.result(rounds=rounds, alpha=self.alpha, tau=self.tau)

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"local": self.local.state_dict()} if not self.is_server else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "local" in state and not self.is_server:
            self.local.load_state_dict(state["local"])
