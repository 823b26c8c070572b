"""Batch-norm statistics recomputed for a model no training forward pass updated (the EASGD
center, a server's weights): tether.training.norm_stats."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from tether.training.norm_stats import (
    SAMPLES,
    calibration_subset,
    recompute_running_stats,
    running_stat_layers,
)


def test_statistics_are_the_cumulative_average_of_the_batches() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, momentum=0.3))
    model.eval()
    batches = [torch.randn(16, 4) * 3 + 5, torch.randn(16, 4) * 2 - 1]
    recompute_running_stats(model, batches, lambda m, x: m(x))
    with torch.no_grad():
        hidden = [model[0](x) for x in batches]
    norm = model[1]
    expected_mean = torch.stack([h.mean(0) for h in hidden]).mean(0)
    expected_var = torch.stack([h.var(0, unbiased=True) for h in hidden]).mean(0)
    assert torch.allclose(norm.running_mean, expected_mean, atol=1e-5)
    assert torch.allclose(norm.running_var, expected_var, atol=1e-4)
    assert norm.momentum == 0.3 and not model.training  # both restored


def test_a_model_without_running_statistics_is_left_alone() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    before = [t.clone() for t in model.state_dict().values()]
    recompute_running_stats(model, [torch.randn(8, 4)], lambda m, x: m(x))
    assert running_stat_layers(model) == []
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values(), strict=True))


def test_the_sample_is_seeded_and_bounded() -> None:
    data = TensorDataset(torch.arange(3 * SAMPLES))
    a, b = calibration_subset(data, seed=7), calibration_subset(data, seed=7)
    assert list(a.indices) == list(b.indices) and len(a) == SAMPLES
    assert list(calibration_subset(data, seed=8).indices) != list(a.indices)
    assert len(calibration_subset(TensorDataset(torch.arange(10)), seed=0)) == 10
