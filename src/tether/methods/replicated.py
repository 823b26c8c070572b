"""What the replicated methods share: every worker holds a full replica of the model, starts
from rank 0's weights, trains with momentum SGD and all-reduces with the configured algorithm and
wire format (sync-sgd averages gradients every step, local-sgd parameters every tau steps)."""

from __future__ import annotations

import torch
from torch import nn

from tether.comm.reducer import build_reducer
from tether.methods.base import MethodContext, TrainingMethod
from tether.observe.metrics import PhaseTotals


def broadcast_parameters(model: nn.Module, transport, src: int = 0) -> None:
    """Make every replica start from rank ``src``'s weights (and buffers, e.g. batch-norm stats)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        transport.broadcast(tensor.data, src=src)


def average_buffers(model: nn.Module, transport) -> None:
    """Average floating-point buffers (batch-norm running statistics) over the replicas.

    Gradients keep the weights identical, but each replica's running statistics see only its own
    shard; averaging them before evaluation makes every replica evaluate the same model. One
    flat all-reduce, not one per buffer.
    """
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    if not buffers or transport.world_size == 1:
        return
    flat = torch.cat([b.reshape(-1) for b in buffers])
    transport.all_reduce(flat)
    flat.div_(transport.world_size)
    offset = 0
    for b in buffers:
        b.copy_(flat[offset : offset + b.numel()].view_as(b))
        offset += b.numel()


def make_sgd(model: nn.Module, config) -> torch.optim.SGD:
    return torch.optim.SGD(
        model.parameters(),
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )


class ReplicatedMethod(TrainingMethod):
    """A method whose workers keep full replicas in step: momentum SGD, the run's all-reducer,
    and a start from rank 0's weights."""

    def __init__(self, model: nn.Module, context: MethodContext) -> None:
        super().__init__(model, context)
        self.optimizer = make_sgd(model, self.config)
        self.reducer = build_reducer(self.transport, self.config)
        self.rounds = 0

    def start(self, step: int = 0) -> None:
        super().start(step)
        broadcast_parameters(self.model, self.transport)

    def finish(self, totals: PhaseTotals | None) -> None:
        del totals
        self.reducer.close()
