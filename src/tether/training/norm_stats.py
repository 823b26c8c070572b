"""Batch-norm statistics for a model that did not train them: the EASGD center, an average of
replicas and a server's weights.

A batch-norm layer keeps running estimates of its inputs' mean and variance, updated by the
forward passes of training and used in place of the batch's own statistics at evaluation. The
model a method evaluates is often not one that ran those forward passes: the elastic center
(sync-, original-, async-, hogwild-EASGD: Zhang, Choromanska, LeCun 2015; You, Buluc, Demmel,
SC17), local-sgd's average of the replicas, and the parameter server's weights (async-sgd,
async-msgd, hogwild-sgd) move only by exchanges of parameters. Their buffers would stay at their
initial values (mean 0, variance 1), and the model is evaluated on activations it never
normalised right. Averaging the workers' buffers would not fix it either: the center's weights
are not any worker's, and neither are the statistics of their activations.

So, before such a model is evaluated (and saved), its statistics are recomputed from its own
forward passes, in training mode without gradients, over a fixed sample of the training set, as
stochastic weight averaging does for its averaged weights (Izmailov et al. 2018;
``torch.optim.swa_utils.update_bn``): a cumulative average over ``SAMPLES`` samples, the same
samples (a seeded draw) at every evaluation and on every rank, so replicated methods stay
deterministic and every rank holds the same statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.data import Dataset, Subset

from tether.config import TrainConfig
from tether.training.batches import eval_batches
from tether.training.task import Task

SAMPLES = 2048  # training samples the statistics are recomputed from (about a fifth of an
# evaluation of a 10,000-sample test set)


def running_stat_layers(model: nn.Module) -> list[_NormBase]:
    """The layers of ``model`` that keep running statistics (batch norm, and instance norm where
    asked to track them)."""
    return [m for m in model.modules() if isinstance(m, _NormBase) and m.track_running_stats]


def calibration_subset(train_data: Dataset, seed: int) -> Subset:
    """``SAMPLES`` training samples (all of them in a smaller set), drawn with ``seed``: the
    same on every rank and at every evaluation."""
    n = len(train_data)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(n, generator=generator)[: min(n, SAMPLES)]
    return Subset(train_data, indices.tolist())


@torch.no_grad()
def recompute_running_stats(
    model: nn.Module, batches: Iterable[Any], forward: Callable[[nn.Module, Any], object]
) -> None:
    """Reset ``model``'s running statistics and average them over ``forward(model, batch)`` for
    each batch (momentum None: a cumulative average, each batch weighted alike), in training
    mode; the layers' momentum and the model's mode are restored after."""
    layers = running_stat_layers(model)
    if not layers:
        return
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None
    was_training = model.training
    model.train()
    try:
        for batch in batches:
            forward(model, batch)
    finally:
        for layer, momentum in zip(layers, momenta, strict=True):
            layer.momentum = momentum
        model.train(was_training)


def recompute_from_training_data(
    model: nn.Module,
    task: Task,
    config: TrainConfig,
    device: torch.device,
    forward: Callable[[nn.Module, Any], object],
) -> None:
    """:func:`recompute_running_stats` over the seeded sample of the task's training data, in
    batches of the run's size (nothing to do for a model without running statistics)."""
    if not running_stat_layers(model):
        return
    sample = calibration_subset(task.train_data, config.seed)
    batches = eval_batches(sample, 0, 1, config.batch_size, device, task.collate_fn, None)
    recompute_running_stats(model, batches, forward)
