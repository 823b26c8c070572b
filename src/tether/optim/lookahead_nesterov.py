"""EAMSGD's local step as a torch optimizer: Nesterov momentum with the gradient at the look-ahead
point (Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015,
Algorithm 2)::

    v <- mu * v - lr * g(x + mu * v)
    x <- x + v

``torch.optim.SGD(nesterov=True)`` is the same recursion written in the look-ahead variable
``y = x + mu * v``; the elastic exchange of async-measgd, however, moves ``x`` (the point the
worker holds between steps), so this optimizer keeps the parameters at ``x`` and takes the
gradient at ``x + mu * v``. That needs the gradient to be computed *inside* the step, at the
moved point: ``step(closure)`` moves the parameters, runs the closure (forward and backward),
moves them back and updates. It therefore requires a closure, as ``torch.optim.LBFGS`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from tether.optim.hyper import require_in_range


class LookaheadNesterov(torch.optim.Optimizer):
    """Nesterov momentum SGD with the gradient taken at ``x + momentum * v`` (EAMSGD's local
    step). ``weight_decay`` adds ``weight_decay * x`` to that gradient (L2 at ``x``)."""

    requires_closure = True  # read by the methods: the backward pass must run inside step()

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        require_in_range("lr", lr, 0, above=True)
        require_in_range("momentum", momentum, 0, below=1)
        require_in_range("weight_decay", weight_decay, 0)
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    def _velocities(self, group: dict[str, Any]) -> list[torch.Tensor]:
        out = []
        for p in group["params"]:
            state = self.state[p]
            if "velocity" not in state:
                state["velocity"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            out.append(state["velocity"])
        return out

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        if closure is None:
            raise RuntimeError(
                "LookaheadNesterov takes the gradient at the look-ahead point, so step() needs "
                "a closure that runs forward and backward (optimizer.step(closure))"
            )
        groups = [(g, list(g["params"]), self._velocities(g)) for g in self.param_groups]
        for group, params, velocity in groups:
            if params:
                torch._foreach_add_(params, velocity, alpha=group["momentum"])  # x + mu*v
        with torch.enable_grad():
            loss = closure()
        for group, params, velocity in groups:
            if not params:
                continue
            mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
            torch._foreach_sub_(params, velocity, alpha=mu)  # back to x
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            if wd:
                grads = list(torch._foreach_add(grads, params, alpha=wd))
            torch._foreach_mul_(velocity, mu)
            torch._foreach_sub_(velocity, grads, alpha=lr)
            torch._foreach_add_(params, velocity)
        return loss
