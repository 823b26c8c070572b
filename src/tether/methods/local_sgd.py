"""local-sgd: periodic model averaging (a modern baseline, not in SC17; Stich 2019, Lin et al. 2020).

Each worker runs its own optimizer (momentum SGD by default); every ``tau`` steps the replicas are
replaced by their mean, ``x_i <- mean_j x_j``, with one all-reduce of the flat parameter vector.
Optimizer state (momentum buffers) stays local. With ``tau = 1`` and plain SGD this is sync SGD up
to floating-point association.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from tether.methods.base import Backward, StepTimes, TrainingMethod
from tether.methods.default_rates import all_workers_rate
from tether.methods.flat import flatten_parameters
from tether.methods.replicated import (
    REDUCER_SETTINGS,
    broadcast_parameters,
    run_reducer,
)
from tether.observe.metrics import PhaseTotals


def average_(flat: torch.Tensor, transport) -> None:
    transport.all_reduce(flat)
    flat.div_(transport.world_size)


class LocalSGD(TrainingMethod):
    """Default tau 4 and sync-sgd's rate (0.1 at a global batch of 256, scaled by min(r, 2),
    a half-epoch warm-up, the gradient's norm clipped at 2): on 4 workers lr 0.1 and 0.05
    reached 85% in the same 348 steps, tau 1 took 406 (benchmarks/results/
    method_defaults_sweep.md; every worker count: benchmarks/results/defaults_*.md).
    """

    name = "local-sgd"
    per_rank_state = True
    defaults = {**all_workers_rate(0.1), "tau": 4}
    local_step_name = "sgd"
    settings = REDUCER_SETTINGS | {"tau", "momentum"}
    composes_with_model_parallel = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # TrainingMethod's arguments
        super().__init__(*args, **kwargs)
        self.reducer = run_reducer(self.context)
        self.rounds = 0
        # The optimizer holds the Parameter objects, whose storage becomes views of ``flat``.
        self.flat = flatten_parameters(self.model)
        self.eval_copy = copy.deepcopy(self.model)
        self.eval_flat = flatten_parameters(self.eval_copy)

    def start(self, step: int = 0) -> None:
        super().start(step)
        if not self.own_replica_restored:
            broadcast_parameters(self.model, self.transport)

    def step(self, backward: Backward, times: StepTimes) -> torch.Tensor | None:
        loss = self.local_update(backward, times)
        if self.local_step % self.config.tau == 0:
            start = self.clock()
            self.reducer.start(self.flat, average=True).wait()
            self.rounds += 1
            times.waited(start, self.clock())
        return loss

    def finish(self, totals: PhaseTotals | None) -> None:
        del totals
        self.reducer.close()

    def summary_extra(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "tau": self.config.tau}

    def eval_model(self) -> nn.Module:
        """The mean of the replicas (what the next averaging would produce), without changing
        any replica, in full precision with the backend's all-reduce. Collective: called on
        every rank."""
        self.eval_flat.copy_(self.flat)
        average_(self.eval_flat, self.transport)
        return self.eval_copy

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rounds = int(state["rounds"])
