"""The user's optimizer with a method's communication inside its ``step()``.

``ctx.wrap(model, optimizer)`` returns this in place of the optimizer, so a training loop written
for one process (``zero_grad``, ``loss.backward()``, ``step``) runs any Tether method unchanged:
sync-sgd steps on the mean gradient (its all-reduces, started during backward, have ended
with it); the EASGD
methods step and exchange with the center every ``tau`` steps; a parameter-server worker pushes
its gradient and takes the server's weights. It is a ``torch.optim.Optimizer`` (a learning-rate
scheduler accepts it) whose ``param_groups`` and ``state`` are the wrapped optimizer's own.

Gradient accumulation over ``k`` backward passes: the first ``k - 1`` calls of ``step()`` only
count (the gradients keep adding up, ``zero_grad`` does nothing in between, and nothing is
communicated during their backward passes); the ``k``-th is the method's step, on the gradient
divided by ``k``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from tether.errors import TetherError
from tether.methods import StepTimes, TrainingMethod
from tether.methods.ps_method import ServerMethod
from tether.optim import needs_closure

# The loss scale's state in the state_dict of a run in fp16, beside the optimizer's
LOSS_SCALE_KEY = "tether_loss_scale"


class MethodOptimizer(torch.optim.Optimizer):
    """A method's view as a torch optimizer; see the module docstring."""

    # Deliberately no super().__init__(): this object holds no parameters of its own; its
    # param_groups, defaults and state are the wrapped optimizer's.
    def __init__(self, method: TrainingMethod, accumulate: int = 1) -> None:
        if accumulate < 1:
            raise ValueError(f"accumulate must be >= 1, got {accumulate}")
        if accumulate > 1 and needs_closure(method.optimizer):
            raise TetherError(
                f"{type(method.optimizer).__name__} takes its gradient inside step() (at a point "
                "of its own), so it cannot accumulate gradients over several steps: use "
                "accumulate=1 or another optimizer"
            )
        self.method = method
        self.optimizer = method.optimizer
        self.accumulate = accumulate
        self.passes = 0  # step() calls, counting the accumulation passes
        self.ended = False  # the run is over (tether.init's ctx.finish): no step communicates
        self.last_times = StepTimes()  # the exposed communication of the last real step
        method.grad_scale = 1.0 / accumulate
        method.set_gradient_sync(accumulate == 1)
        # Where the server applies the updates and no schedule was given to the method, a rate
        # the user's loop changes on this worker (its own scheduler) changes nothing: said once.
        server_steps = isinstance(method, ServerMethod) and method.updates_on_server
        self._rates = self._worker_rates() if server_steps and method.scheduler is None else None

    # The wrapped optimizer's state, shared rather than copied, so that a scheduler built on
    # this object changes the rates the wrapped one uses.
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def accumulating(self) -> bool:
        """True while the next ``step()`` only counts a backward pass."""
        return (self.passes + 1) % self.accumulate != 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients, unless an accumulation is under way. The method decides how
        (sync-sgd zeroes its fused buffer in place, whatever ``set_to_none`` says)."""
        del set_to_none
        if self.passes % self.accumulate == 0:  # not in the middle of an accumulation
            self.method.zero_grad()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """The method's step; ``closure`` (optional) runs forward and backward and returns the
        loss, as for any torch optimizer."""
        if self.ended:  # torch's own words would advise init_process_group
            raise TetherError(
                "optimizer.step() after ctx.finish(): the run is over and its process group "
                "gone; call ctx.finish() once, after the last step"
            )
        if self.accumulating:
            loss = closure() if closure is not None else None
            self.passes += 1
            # Whether the next backward pass ends the accumulation: it communicates.
            self.method.set_gradient_sync(not self.accumulating)
            return loss
        if closure is None and needs_closure(self.optimizer):
            raise TetherError(
                f"{type(self.optimizer).__name__} takes the gradient inside step(): call "
                "optimizer.step(closure) with a closure that runs forward and backward"
            )
        if self._rates is not None and self._worker_rates() != self._rates:
            self._warn_rates_unused(self._worker_rates())
        times = StepTimes()
        # The pass counter moves after the step: a closure that calls zero_grad at its start
        # must not clear the gradients this step accumulated.
        loss = self.method.step(closure or _nothing, times)
        self.passes += 1
        self.last_times = times
        self.method.set_gradient_sync(self.accumulate == 1)
        return loss

    def _worker_rates(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def _warn_rates_unused(self, rates: list[float]) -> None:
        print(
            f"tether: warning: {self.method.name}'s server applies every update with its own "
            f"optimizer and schedule: this worker's learning rate moved from {self._rates} to "
            f"{rates} and changes nothing; give your scheduler to ctx.wrap(model, opt, "
            "scheduler), which steps the server's on the run's global step",
            file=sys.stderr,
        )
        self._rates = None  # once

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state, and under fp16 the loss scale's (a loop that saves and
        loads ``opt.state_dict()`` resumed from the initial scale, skipping steps to find it)."""
        state = self.optimizer.state_dict()
        if self.method.scaler is not None:
            state = {**state, LOSS_SCALE_KEY: self.method.scaler.state_dict()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        scale = state.pop(LOSS_SCALE_KEY, None)
        self.optimizer.load_state_dict(state)
        if scale is not None and self.method.scaler is not None:
            self.method.scaler.load_state_dict(scale)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise RuntimeError(
            "parameters cannot be added once a method is bound to the optimizer (its buffers "
            "and messages are sized at wrap time): add them before ctx.wrap"
        )

    def __repr__(self) -> str:
        return f"MethodOptimizer({self.method.name}, {self.optimizer!r})"


def _nothing() -> None:
    return None
