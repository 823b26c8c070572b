"""Elastic Averaging SGD with a center-variable server: the shared part of original-easgd,
async-easgd and async-measgd (You, Buluc, Demmel, SC17, section 4; Zhang et al., NIPS 2015).

Every ``tau`` local steps worker i sends its flat weights ``x_i`` (one message); the server computes
``d = x_i - c`` with its current center, replies with that same ``c``, and then moves the center
``c <- c + alpha*d``; the worker moves ``x_i <- x_i - alpha*d``. The methods differ only in the order
the server serves workers (round-robin or first come, first served) and in the worker's default
local step (plain SGD, or EAMSGD's Nesterov momentum); the local step is the user's optimizer when
one is given.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tether.comm.header import MessageKind
from tether.config import TrainConfig
from tether.methods.base import Backward, StepTimes
from tether.methods.ps_method import ServeResult, ServerHooks, ServerMethod

# The elastic methods' own settings (config keys): setting them for another method warns.
ELASTIC_SETTINGS = frozenset({"alpha", "rho", "tau"})


def elastic_rate(config: TrainConfig, workers: int) -> float:
    """``alpha``: given directly, or ``eta * rho`` (Zhang et al.'s parametrisation, eta the rate
    the workers step with: ``lr`` scaled with the batch where ``lr_base_batch`` says so), or the
    EASGD paper's ``beta = P*alpha = 0.9``."""
    if config.alpha is not None:
        return config.alpha
    if config.rho is not None:
        return config.scaled_lr * config.rho
    return 0.9 / workers


def elastic_worker_update(x: torch.Tensor, center: torch.Tensor, alpha: float) -> None:
    """``x <- x - alpha * (x - c)``, in place."""
    x.sub_(x - center, alpha=alpha)


class ElasticServerMethod(ServerMethod):
    """EASGD with the center on a server; subclasses choose the service order and local step."""

    round_robin: ClassVar[bool] = False
    settings = ELASTIC_SETTINGS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alpha = elastic_rate(self.config, self.computing_workers())
        self.tau = self.config.tau

    # -- worker ----------------------------------------------------------------------------------
    def step(self, backward: Backward, times: StepTimes) -> torch.Tensor | None:
        loss = self.local_update(backward, times)
        if self.local_step % self.tau == 0:
            start = self.clock()
            center = self.link.exchange(self.flat, MessageKind.PARAMS, self.local_step)
            if center is not None:
                elastic_worker_update(self.flat, center, self.alpha)
            times.waited(start, self.clock(), self.link.take_paused())
            self.advance_schedule(self.link.global_step)
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

        def round_end(msg) -> bool:  # round-robin: the last active worker of the rotation
            return msg.header.sender == max(server.state.active)

        ends = round_end if self.round_robin else None
        rounds = self.serve_loop(hooks, arrivals, difference, move_center, ends)
        return self.result(rounds=rounds, alpha=self.alpha, tau=self.tau)

    def shard_after(self, step: int) -> bool:
        # Under round-robin every worker exchanges at the same local steps, and the round that
        # ends there leaves the server at global step ``step``: the points it checkpoints at.
        return self.per_rank_state and self.round_robin and step % self.tau == 0

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # The server's (checkpoint.pt): the center is the model; workers restart from it with
        # fresh local optimizers, which also lets a run resume with a different worker count.
        # A worker's own shard (per_rank_state: original-easgd) keeps its local optimizer.
        # The server's rounds so far: a resumed run's summary counts the whole run's.
        if self.per_rank_state and not self.is_server:
            return super().state_dict()
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("own_replica", False):  # a worker's own shard: its replica and optimizer
            super().load_state_dict(state)
        self.updates = int(state.get("updates", 0))
