"""LAMB: layer-wise adaptive moments (You, Li, Reddi, et al. 2019, "Large batch optimization for
deep learning: training BERT in 76 minutes"), as a ``torch.optim.Optimizer``.

Adam's update with decoupled weight decay, scaled per parameter tensor by the ratio of the
weights' norm to the update's norm::

    m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g^2
    r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    u = r + wd * w
    w = w - lr * (||w|| / ||u||) * u

With the ratio forced to 1 (``trust_ratio=False``) this is AdamW (``w <- w - lr*wd*w - lr*r``,
the same arithmetic grouped differently: equal up to rounding). Parameters excluded by
``exclude`` (default: biases and normalisation parameters) take the Adam update with neither
weight decay nor the ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from tether.optim.hyper import require_in_range
from tether.optim.trust import ExcludeRule, TrustRatio, is_bias_or_norm, safe_ratio


class LAMB(TrustRatio, torch.optim.Optimizer):
    """Layer-wise adaptive moments; see the module docstring."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        trust_ratio: bool = True,
        exclude: ExcludeRule | None = is_bias_or_norm,
    ) -> None:
        require_in_range("lr", lr, 0, above=True)
        require_in_range("betas[0]", betas[0], 0, below=1)
        require_in_range("betas[1]", betas[1], 0, below=1)
        require_in_range("weight_decay", weight_decay, 0)
        require_in_range("eps", eps, 0)
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "trust_ratio": trust_ratio,
        }
        TrustRatio.__init__(self, exclude)
        torch.optim.Optimizer.__init__(self, params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                g = self.gradient(p)
                if g is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = float(state["step"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                update = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + group["eps"])
                excluded = self.exclude(p)
                if not excluded and group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                if group["trust_ratio"] and not excluded:
                    weight_norm, update_norm = self.norms(p, update)
                    update.mul_(safe_ratio(weight_norm, update_norm).to(update.dtype))
                p.add_(update, alpha=-group["lr"])
        return loss
