"""Evaluation metrics: ``metric(outputs, targets) -> float``, averaged over the evaluation set.

Tether evaluates a metric batch by batch and weights each batch's value by its number of samples,
so a metric must be a mean over the batch (as these are). ``METRICS`` holds the ones a user can
name (``--metric accuracy``); any callable of the same form works in ``tether.fit(metrics=...)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tether.errors import TetherError
from tether.registry import Registry

Metric = Callable[[torch.Tensor, torch.Tensor], float]


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Share of samples whose highest-scoring class (``outputs.argmax(1)``) is the target.
    Class scores ``(N, C, ...)`` against class indices ``(N, ...)`` only (a sequence's tokens
    too): a regression's outputs would score 0 without a word."""
    scores = (
        outputs.ndim == targets.ndim + 1
        and outputs.shape[0] == targets.shape[0]
        and outputs.shape[2:] == targets.shape[1:]
        and not (targets.is_floating_point() or targets.is_complex())
    )
    if not scores:
        raise TetherError(
            f"accuracy needs class scores (N, C) against class indices (N,), got outputs of "
            f"shape {list(outputs.shape)} and {targets.dtype} targets of shape "
            f"{list(targets.shape)}: a regression takes mae or mse"
        )
    return float((outputs.argmax(dim=1) == targets).float().mean())


def mean_absolute_error(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean of ``|outputs - targets|`` (outputs reshaped like the targets)."""
    return float((_like_targets(outputs, targets, "mae") - targets).abs().float().mean())


def mean_squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean of ``(outputs - targets)^2`` (outputs reshaped like the targets)."""
    return float((_like_targets(outputs, targets, "mse") - targets).float().pow(2).mean())


def _like_targets(outputs: torch.Tensor, targets: torch.Tensor, name: str) -> torch.Tensor:
    """The outputs in the targets' shape: one value per target (a regression)."""
    if outputs.numel() != targets.numel():
        raise TetherError(
            f"{name} needs one output per target, got outputs of shape {list(outputs.shape)} "
            f"and targets of shape {list(targets.shape)}: a classifier takes accuracy"
        )
    return outputs.reshape(targets.shape)


def is_classification(outputs: torch.Tensor, targets: torch.Tensor) -> bool:
    """Class scores ``(N, C)`` against class indices ``(N,)``: where accuracy means something."""
    return (
        outputs.ndim == 2
        and targets.ndim == 1
        and not targets.is_floating_point()
        and not targets.is_complex()
        and outputs.shape[0] == targets.shape[0]
    )


METRICS: Registry[Metric] = Registry("metric")
METRICS.register("accuracy", help="share of samples whose top class is the target")(accuracy)
METRICS.register("mae", help="mean absolute error")(mean_absolute_error)
METRICS.register("mse", help="mean squared error")(mean_squared_error)
