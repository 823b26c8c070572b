"""LARS: layer-wise adaptive rate scaling (You, Gitman, Ginsburg 2017, "Large batch training of
convolutional networks"), as a ``torch.optim.Optimizer`` usable in any loop and under every
Tether method.

For each parameter tensor ``w`` with gradient ``g``, weight decay ``wd`` and trust coefficient
``eta``::

    trust = eta * ||w|| / (||g|| + wd * ||w|| + eps)
    d     = trust * (g + wd * w)            # the trust ratio scales the update before momentum
    b     = momentum * b + d                # (the first step: b = d)
    w     = w - lr * b

This is the paper's form (the ratio applied to the update, then momentum), written with the
learning rate outside the momentum buffer as ``torch.optim.SGD`` does, so that with the trust
ratio forced to 1 (``trust_ratio=False``) it is exactly momentum SGD, operation for operation.
``clip=True`` is apex's LARC "clip" mode instead: the local rate never exceeds the global one,
``trust <- min(trust / lr, 1)``. A layer whose weight or gradient norm is 0 (zero-initialised)
takes ``trust = 1``, the plain step, in both modes, as LARC does.

Parameters excluded by ``exclude`` (default: biases and normalisation parameters, tensors of at
most one dimension; see :mod:`tether.optim.trust`) take plain momentum SGD with neither the trust
ratio nor weight decay, as Jia et al. (2018) train at a 64k batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from tether.optim.hyper import require_in_range
from tether.optim.trust import ExcludeRule, TrustRatio, is_bias_or_norm


class LARS(TrustRatio, torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling; see the module docstring. A parameter group with
    ``trust_ratio=False`` takes plain momentum SGD (weight decay included)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        eps: float = 1e-9,
        clip: bool = False,
        trust_ratio: bool = True,
        exclude: ExcludeRule | None = is_bias_or_norm,
    ) -> None:
        require_in_range("lr", lr, 0, above=True)
        require_in_range("momentum", momentum, 0, below=1)
        require_in_range("weight_decay", weight_decay, 0)
        require_in_range("eta", eta, 0, above=True)
        require_in_range("eps", eps, 0)
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "eta": eta,
            "eps": eps,
            "clip": clip,
            "trust_ratio": trust_ratio,
        }
        TrustRatio.__init__(self, exclude)
        torch.optim.Optimizer.__init__(self, params, defaults)

    def trust(self, group: dict[str, Any], p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The layer's trust ratio (a 0-d tensor): how much of the global rate it takes."""
        weight_norm, grad_norm = self.norms(p, g)
        wd, lr = group["weight_decay"], group["lr"]
        ratio = group["eta"] * weight_norm / (grad_norm + wd * weight_norm + group["eps"])
        if group["clip"]:
            ratio = torch.clamp(ratio / lr, max=1.0)
        # A layer with a zero norm (zero-initialised, or no gradient) takes the plain step,
        # ratio 1 (as apex's LARC): eta and the clip belong to the ratio, and eta alone would
        # shrink its step a thousandfold
        return torch.where((weight_norm > 0) & (grad_norm > 0), ratio, torch.ones_like(ratio))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            mu, lr = group["momentum"], group["lr"]
            for p in group["params"]:
                g = self.gradient(p)
                if g is None:
                    continue
                excluded = self.exclude(p)
                wd = 0.0 if excluded else group["weight_decay"]
                d = torch.add(g, p, alpha=wd) if wd else g.clone()
                if group["trust_ratio"] and not excluded:
                    d.mul_(self.trust(group, p, g).to(d.dtype))
                state = self.state[p]
                if mu:
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = d.detach().clone()
                    else:
                        state["momentum_buffer"].mul_(mu).add_(d)
                    d = state["momentum_buffer"]
                p.add_(d, alpha=-lr)
        return loss
