"""What a step minimises and what an evaluation measures: the user's loss and metrics, applied
to a batch.

Two forms, told apart by the loss's parameter names:

- ``loss(outputs, targets)`` (the default, e.g. ``torch.nn.CrossEntropyLoss()``): a batch is an
  ``(inputs, targets)`` pair (a tuple or list of two), and the model is called on the inputs;
- ``loss(model, batch)``: anything else (a language model, a dict batch, several outputs); the
  function calls the model itself. Metrics then take ``(model, batch)`` too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tether.errors import TetherError
from tether.registry import Registry


def takes_model_and_batch(fn: Callable[..., Any]) -> bool:
    """True when ``fn``'s first parameter is named ``model`` (the ``(model, batch)`` form)."""
    target = fn.forward if isinstance(fn, nn.Module) else fn
    try:
        params = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: the default form
        return False
    return bool(params) and params[0] == "model"


def split_batch(batch: Any) -> tuple[Any, Any]:
    """``(inputs, targets)`` of a batch in the default form, or a one-line error saying how to
    use another form."""
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    shape = (
        f"a dict with keys {sorted(batch)}"
        if isinstance(batch, Mapping)
        else f"a {type(batch).__name__}"
        + (f" of {len(batch)} items" if isinstance(batch, tuple | list) else "")
    )
    raise TetherError(
        f"a batch is an (inputs, targets) pair unless the loss takes the batch itself; got "
        f"{shape}: write the loss as `def loss(model, batch): ...`"
    )


@dataclass(frozen=True)
class Evaluated:
    """One batch's loss (a scalar tensor), and the outputs and targets when the batch has the
    default form."""

    loss: torch.Tensor
    outputs: torch.Tensor | None
    targets: torch.Tensor | None


class Objective:
    """The user's loss over a batch, whichever form it has (see the module docstring)."""

    def __init__(self, loss: Callable[..., torch.Tensor]) -> None:
        self.loss = loss
        self.takes_model = takes_model_and_batch(loss)

    def __call__(self, model: nn.Module, batch: Any) -> Evaluated:
        if self.takes_model:
            value = self.loss(model, batch)
            outputs = targets = None
        else:
            inputs, targets = split_batch(batch)
            outputs = model(inputs)
            value = self.loss(outputs, targets)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            what = (
                f"a tensor of shape {tuple(value.shape)}"
                if isinstance(value, torch.Tensor)
                else f"a {type(value).__name__}"
            )
            raise TetherError(
                f"the loss must return a scalar tensor, got {what} (reduce it, e.g. .mean())"
            )
        return Evaluated(value.reshape(()), outputs, targets)


class RegressionLoss(nn.Module):
    """MSE or L1 with the outputs reshaped like the targets when they hold as many values: a
    model's ``(N, 1)`` output against ``(N,)`` targets would otherwise broadcast to ``(N, N)``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if outputs.shape != targets.shape and outputs.numel() == targets.numel():
            outputs = outputs.reshape(targets.shape)
        targets = targets.to(outputs.dtype)
        if self.kind == "mse":
            return F.mse_loss(outputs, targets)
        return F.l1_loss(outputs, targets)


LossBuilder = Callable[[float], Callable[..., torch.Tensor]]
"""``label_smoothing -> loss``."""

LOSSES: Registry[LossBuilder] = Registry("loss", "losses")
LOSSES.register("cross-entropy", help="classification; --set label_smoothing=0.1 to smooth")(
    lambda smoothing: nn.CrossEntropyLoss(label_smoothing=smoothing)
)
LOSSES.register("mse", help="mean squared error (regression)")(lambda _: RegressionLoss("mse"))
LOSSES.register("l1", help="mean absolute error (regression)")(lambda _: RegressionLoss("l1"))
REGRESSION_LOSSES = ("mse", "l1")  # the named losses of a regression, which has no accuracy
