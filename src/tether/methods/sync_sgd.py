"""Synchronous data-parallel SGD with fused, overlapped gradient all-reduce.

Every worker holds an identical replica, computes the gradient of its shard of the global batch,
and the gradients are averaged with all-reduce before each worker applies the same update (the
"Sync SGD" baseline of You, Buluc, Demmel, SC17, and of Goyal et al. 2017). Communication uses
:class:`~tether.comm.fusion.GradientBucketer`: one flat buffer cut into buckets whose all-reduces
start during backward (wait-free backprop), so only the tail of the communication is exposed.

With per-worker batch b on N workers the update equals single-process training on the global
batch N*b when the loss is a mean over the batch, because the mean of the per-worker mean losses
is the mean over the global batch. The update is the user's optimizer (momentum SGD by default).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tether.comm.fusion import GradientBucketer
from tether.methods.base import Backward, StepTimes
from tether.methods.bucketed import BucketedGradients
from tether.methods.default_rates import all_workers_rate
from tether.methods.flat import check_one_buffer
from tether.methods.replicated import (
    REDUCER_SETTINGS,
    average_buffers,
    broadcast_parameters,
    run_reducer,
)
from tether.observe.metrics import PhaseTotals


class SyncSGD(BucketedGradients):
    """Synchronous SGD with tensor fusion and communication overlapped with backward.

    Default rate 0.1 at a global batch of 256 (fastest to 85% on LeNet-5 / Fashion-MNIST, 4
    workers; 0.2 diverged: benchmarks/results/method_defaults_sweep.md), scaled by min(r, 2)
    for another global batch, with a half-epoch warm-up and the gradient's norm clipped at 2:
    the best rates at 1 and 2 workers were 0.025 and 0.05, and at 8 workers the linear rule's
    0.2 reached 88% only when clipped (0.12 unclipped diverged; benchmarks/results/defaults_*.md,
    clip_sweep_*.md).
    """

    name = "sync-sgd"
    defaults = all_workers_rate(0.1)
    local_step_name = "sgd"
    settings = REDUCER_SETTINGS | {"bucket_mb", "momentum", "overlap"}
    composes_with_model_parallel = True
    bucketer: GradientBucketer

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        # only the trainable parameters share the gradient buckets (a frozen one is broadcast)
        check_one_buffer(model, cls.name, trainable_only=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # TrainingMethod's arguments
        super().__init__(*args, **kwargs)
        self.reducer = run_reducer(self.context)
        self.rounds = 0
        self.bucketer = GradientBucketer(
            list(self.model.parameters()),
            self.reducer,
            self.config.bucket_mb or None,
            overlap=self.config.overlap,
        )

    def start(self, step: int = 0) -> None:
        super().start(step)
        broadcast_parameters(self.model, self.transport)

    def step(self, backward: Backward, times: StepTimes) -> torch.Tensor | None:
        loss = self.local_update(backward, times, wait=self.wait_for_gradients)
        self.rounds += 1
        return loss

    def finish(self, totals: PhaseTotals | None) -> None:
        del totals
        self.reducer.close()
        self.remove_bucketer()

    def summary_extra(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "buckets": len(self.bucketer.layout.buckets)}

    # the rounds so far: a resumed run's summary counts the whole run's
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rounds = int(state.get("rounds", 0))  # none in a checkpoint from before they were

    def eval_model(self) -> nn.Module:
        average_buffers(self.model, self.transport)
        return self.model
