"""Which model a worker scores at an evaluation, and on which share of the evaluation set.

Replicated methods score their own model sharded over the data-parallel group (every rank a
share, the sums all-reduced: :class:`~tether.training.evaluation.Evaluator`). Methods with a
parameter server score on the server alone, the whole set. Where the scored model is not the one
training ran forward through (the EASGD center, a server's weights) its batch-norm statistics are
recomputed from training data first (:mod:`tether.training.norm_stats`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.methods import Role, TrainingMethod
from tether.training.batches import eval_batches
from tether.training.evaluation import Evaluator
from tether.training.norm_stats import recompute_from_training_data
from tether.training.objective import Evaluated, Objective
from tether.training.server_progress import WaitingWorkers
from tether.training.task import Task


class Scoring:
    """The run's evaluation of its method's model: ``has_data`` (an evaluation set to score),
    ``on_server`` (one process scores: the parameter-server methods), :meth:`score`."""

    def __init__(
        self,
        config: TrainConfig,
        task: Task,
        method: TrainingMethod,
        transport: TorchTransport,
        device: torch.device,
        objective: Objective,
        forward: Callable[[nn.Module, Any], Evaluated],
    ) -> None:
        self.config, self.task, self.method = config, task, method
        self.transport, self.device, self.forward = transport, device, forward
        self.on_server = method.server_processes > 0
        self.has_data = task.eval_data is not None and len(task.eval_data) > 0  # type: ignore[arg-type]
        self.evaluator = Evaluator(
            objective, task.metrics, None if self.on_server else transport.all_reduce
        )
        # A server's workers that wait for its replies while it evaluates, told between
        # batches that it is busy (set by the trainer for the methods whose workers wait).
        self.waiting: WaitingWorkers | None = None

    def _tick(self, batch: Any) -> Any:
        if self.waiting is not None:
            self.waiting.tick()
        return batch

    def _batches(self, rank: int, world: int, batch_size: int) -> Iterator[Any]:
        data = self.task.eval_data
        if data is None:
            return iter(())
        return iter(
            eval_batches(data, rank, world, batch_size, self.device, self.task.collate_fn, None)
        )

    def fix_metrics(self) -> None:
        """Choose the metrics from the first evaluation sample, the same on every rank that
        scores (so every rank reduces the same sums, even one whose share is empty)."""
        if not self.has_data or (self.on_server and self.method.role() is not Role.SERVER):
            return
        self.evaluator.fix_metrics(self.method.model, next(self._batches(0, 1, 1)))

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Around a server's long step outside an evaluation (a checkpoint's save, the final
        results): the workers that wait for it, or watch its pulse, and its supervisor hear
        from it before and after."""
        if self.waiting is not None:
            self.waiting.reassure()
        try:
            yield
        finally:
            if self.waiting is not None:
                self.waiting.reassure()

    def score(self) -> Mapping[str, float]:
        """The loss and metrics of the model the method evaluates (empty without data)."""
        if self.waiting is None:
            return self._score()
        self.waiting.start()
        try:
            return self._score()
        finally:
            self.waiting.end()

    def _score(self) -> Mapping[str, float]:
        model = self.method.eval_model()
        if self.on_server or model is not self.method.model:  # a center, or a server's weights:
            # no forward pass of training updated its batch-norm statistics
            recompute_from_training_data(
                model,
                self.task,
                self.config,
                self.device,
                lambda module, batch: self.forward(module, self._tick(batch)),
            )
        if not self.has_data:
            return {}
        rank, world = (0, 1) if self.on_server else (self.transport.rank, self.transport.world_size)
        batches = self._batches(rank, world, self.config.eval_batch_size)
        return self.evaluator.evaluate(model, map(self._tick, batches))
