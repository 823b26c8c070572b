"""async-sgd: parameter-server SGD, first come, first served (Dean et al. 2012, "Downpour").

A worker computes a gradient at the weights it last received (averaged over ``tau`` batches when
``tau > 1``), pushes it as one message, and receives the current weights in reply. The server
applies each gradient on arrival, one at a time, with its optimizer (plain SGD by default,
``w <- w - lr * (g + wd * w)``; the user's optimizer when one is given, so the server also holds
its state, e.g. Adam's moments) and steps its learning-rate schedule on the run's global step. A
gradient computed on weights more than ``--staleness-bound`` updates old is dropped (counted in
summary.json) and the worker just gets fresh weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from tether.comm.header import MessageKind
from tether.config import TrainConfig
from tether.methods.base import Backward, StepTimes
from tether.methods.default_rates import damped_step, own_batch_rate
from tether.methods.flat import flat_gradient
from tether.methods.ps_method import ServeResult, ServerHooks, ServerMethod
from tether.optim import LOCAL_STEPS, OptimizerSettings


class AsyncSGD(ServerMethod):
    """Default lr 0.1: fastest to 85% test accuracy on LeNet-5 / Fashion-MNIST, 4 workers,
    13.5-17.7 s against 17.9-21.3 s at 0.05; 0.2 did not reach it in 4 epochs and 0.4 diverged
    (benchmarks/results/method_defaults_sweep.md). Beyond 4 workers the default step is damped
    by 4 / P (:func:`~tether.methods.default_rates.damped_step`).
    """

    name = "async-sgd"
    defaults = own_batch_rate(0.1, damped=True)
    settings = frozenset({"tau", "staleness_bound", "async_base_workers"})
    updates_on_server = True

    @classmethod
    def build_default_optimizer(
        cls, params: Iterable[torch.Tensor], config: TrainConfig
    ) -> torch.optim.Optimizer:
        """The server's step, damped for the worker count (``async_base_workers``: the
        defaults'), from the momentum where this method keeps one (async-msgd)."""
        settings = OptimizerSettings.of(config)
        momentum = settings.momentum if "momentum" in cls.settings else 0.0
        lr, momentum = damped_step(settings.lr, momentum, config.async_damping)
        damped = dataclasses.replace(settings, lr=lr, momentum=momentum)
        return LOCAL_STEPS[cls.local_step_name](params, damped)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tau = self.config.tau
        self.accumulated = torch.zeros_like(self.flat)
        self.pushable = 0  # the accumulated batches whose gradient did not overflow (fp16)
        # Server: the version of the weights, and the version each worker last received.
        self.version = 0
        self.sent_version = dict.fromkeys(range(1, self.transport.world_size), 0)
        self.dropped = 0
        self.params = list(self.model.parameters())  # views of ``flat``, in its order

    # -- worker ----------------------------------------------------------------------------------
    def step(self, backward: Backward, times: StepTimes) -> torch.Tensor | None:
        loss = backward()  # (not local_update: the server applies the optimizer step)
        if loss is not None:
            self.note_loss(float(loss))  # reported with the next push
        self.scale_gradients()
        overflow = self.unscale_gradients()
        if self.scaler is not None:
            self.scaler.update(overflow)
        if not overflow:  # a gradient that overflowed (fp16) is never pushed
            self.clip_gradients()  # per worker: the server applies each push as it comes
            self.accumulated.add_(flat_gradient(self.model))
            self.pushable += 1
        self.local_step += 1
        if self.local_step % self.tau == 0:
            start = self.clock()
            if self.pushable:
                self.accumulated.div_(self.pushable)
                weights = self.link.exchange(
                    self.accumulated, MessageKind.GRADIENT, self.local_step
                )
            else:  # nothing clean to push: just take the current weights
                weights = self.link.fetch(self.local_step)
            if weights is not None:
                self.flat.copy_(weights)
            self.accumulated.zero_()
            self.pushable = 0
            times.waited(start, self.clock(), self.link.take_paused())
        return loss

    # -- server ----------------------------------------------------------------------------------
    def apply_gradient(self, grad: torch.Tensor) -> None:
        """The server's update: ``grad`` (flat, in the parameters' order) becomes the
        parameters' gradients, then one optimizer step and the schedule to the global step."""
        offset = 0
        for p in self.params:
            p.grad = grad[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.optimizer.step()
        self.advance_schedule(self.server.state.global_step())

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
        # Written by the server: its optimizer (the one that applies the gradients) and schedule,
        # and its counters (the whole run's in a resumed run's summary).
        counters = {"version": self.version, "updates": self.updates, "dropped": self.dropped}
        return {**super().state_dict(), **counters}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.is_server:
            super().load_state_dict(state)
        self.version = int(state.get("version", 0))
        self.updates = int(state.get("updates", 0))
        self.dropped = int(state.get("dropped", 0))
        # Every worker of the resumed run starts from the restored weights (the handshake):
        # a gradient's staleness counts from there, not from version 0.
        self.sent_version = dict.fromkeys(self.sent_version, self.version)
