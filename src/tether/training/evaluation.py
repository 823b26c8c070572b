"""Evaluation with the user's loss and metrics, sharded over the ranks that hold identical
replicas.

Every metric is a mean over a batch; each batch's value is weighted by its sample count and the
sums (float64, so shards add exactly) are all-reduced once, so every rank gets the same numbers
and they equal a one-process evaluation of the whole set. Without metrics given, a run reports
the mean loss and, when the model's outputs are class scores ``(N, C)`` and the targets class
indices ``(N,)``, the accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from tether.metrics import accuracy, is_classification
from tether.training.batches import batch_size_of
from tether.training.objective import Objective, takes_model_and_batch

Metrics = Mapping[str, Callable[..., float]]


MIN_EVALUATIONS = 8  # a short run still gets a curve, not a point
MIN_EVAL_INTERVAL = 10  # ...but a very short one is not evaluated at every step


def default_eval_every(steps_per_epoch: int, total_steps: int | None = None) -> int:
    """About four evaluations per epoch, and at least ``MIN_EVALUATIONS`` in a run of
    ``total_steps`` (no closer than ``MIN_EVAL_INTERVAL`` steps apart): enough points for an
    accuracy-vs-time curve. The last step is always evaluated as well. (Rounded, not floored: a
    large batch's epoch of 7 steps is evaluated every 2 steps, not at every one.)"""
    every = max(1, round(steps_per_epoch / 4))
    if total_steps is not None:
        every = min(every, max(MIN_EVAL_INTERVAL, total_steps // MIN_EVALUATIONS))
    return every


def eval_interval(asked: int, steps_per_epoch: int, total_steps: int, has_eval_data: bool) -> int:
    """Steps between evaluations: ``asked`` (0: :func:`default_eval_every`). Without evaluation
    data, the run's length: only the last step is evaluated, which fixes the model that is saved
    (a center's batch-norm statistics); an evaluation between would be a pause with nothing to
    measure, and for local-sgd an all-reduce of the replicas that would cost a short run as
    much as its steps."""
    if not has_eval_data:
        return max(1, total_steps)
    return asked or default_eval_every(steps_per_epoch, total_steps)


class Evaluator:
    """Scores a model on batches with the loss and metrics; ``all_reduce`` (sums in place) joins
    the ranks' shares, or is None when one process scores the whole set (a server)."""

    def __init__(
        self,
        objective: Objective,
        metrics: Metrics | None,
        all_reduce: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self.objective = objective
        self.given = dict(metrics) if metrics is not None else None
        self.all_reduce = all_reduce
        self.names: list[str] | None = None  # fixed at the first batch, the same on every rank
        self._chosen: dict[str, Callable[..., float]] = {}

    def _metrics(self, outputs: Any, targets: Any) -> dict[str, Callable[..., float]]:
        if self.given is not None:
            return self.given
        if (
            isinstance(outputs, torch.Tensor)
            and isinstance(targets, torch.Tensor)
            and is_classification(outputs, targets)
        ):
            return {"accuracy": accuracy}
        return {}

    @torch.no_grad()
    def fix_metrics(self, model: nn.Module, batch: Any) -> list[str]:
        """Choose the metrics from one batch (every rank passes the same one, so every rank
        reduces the same sums even when its own share of the evaluation set is empty)."""
        was_training = model.training
        model.eval()
        try:
            result = self.objective(model, batch)
        finally:
            model.train(was_training)
        self._chosen = self._metrics(result.outputs, result.targets)
        self.names = ["loss", *self._chosen]
        return self.names

    def names_for(self, outputs: Any, targets: Any) -> list[str]:
        """What an evaluation of a model giving ``outputs`` for ``targets`` reports."""
        return ["loss", *self._metrics(outputs, targets)]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> dict[str, float]:
        """``{"loss": mean loss, name: mean metric, ...}`` over ``batches``."""
        was_training = model.training
        model.eval()
        sums: torch.Tensor | None = None
        if self.names is not None:
            sums = torch.zeros(len(self.names) + 1, dtype=torch.float64)
        try:
            for batch in batches:
                result = self.objective(model, batch)
                if self.names is None:
                    self._chosen = self._metrics(result.outputs, result.targets)
                    self.names = ["loss", *self._chosen]
                if sums is None:
                    sums = torch.zeros(len(self.names) + 1, dtype=torch.float64)
                n = batch_size_of(batch) or 1
                values = [float(result.loss)]
                for fn in self._chosen.values():
                    if takes_model_and_batch(fn):
                        values.append(float(fn(model, batch)))
                    else:
                        values.append(float(fn(result.outputs, result.targets)))
                sums[:-1] += torch.tensor(values, dtype=torch.float64) * n
                sums[-1] += n
        finally:
            model.train(was_training)
        if sums is None or self.names is None:  # nothing to evaluate and nothing chosen
            self.names, self._chosen = ["loss"], {}
            sums = torch.zeros(2, dtype=torch.float64)
        if self.all_reduce is not None:
            self.all_reduce(sums)
        count = float(sums[-1]) or 1.0
        return {name: float(v) / count for name, v in zip(self.names, sums[:-1], strict=True)}
