"""Test-set evaluation, sharded over the ranks that hold identical replicas."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tether.comm.transport import TorchTransport
from tether.data import shard_range


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    loss: float


@torch.no_grad()
def _sums(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device, batch: int) -> torch.Tensor:
    """(correct, summed loss, count) over ``x``; computed in float64 so shards add exactly."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    for start in range(0, len(x), batch):
        xb, yb = x[start : start + batch].to(device), y[start : start + batch].to(device)
        logits = model(xb)
        totals[0] += (logits.argmax(1) == yb).sum().item()
        totals[1] += F.cross_entropy(logits, yb, reduction="sum").item()
        totals[2] += len(yb)
    model.train(was_training)
    return totals


def evaluate_sharded(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    transport: TorchTransport | None,
    device: torch.device,
    batch: int = 1000,
) -> EvalResult:
    """Each rank scores its contiguous shard; one all-reduce gives every rank the same result.
    Without a transport, this process scores the whole test set alone (a server)."""
    rank, world = (transport.rank, transport.world_size) if transport else (0, 1)
    lo, hi = shard_range(len(x), rank, world)
    totals = _sums(model, x[lo:hi], y[lo:hi], device, batch)
    if transport is not None:
        transport.all_reduce(totals)
    correct, loss, count = totals.tolist()
    return EvalResult(correct / count, loss / count)
