"""sync-easgd: synchronous Elastic Averaging SGD with a replicated center (SC17, Algorithm 4).

Every ``tau`` local steps all workers do one round together: each computes ``d_i = x_i - c`` with
the same center, moves ``x_i <- x_i - alpha*d_i`` at once, and the center moves by
``c <- c + alpha * sum_i d_i``. The sum is ONE all-reduce of the flat vector (the paper reduces the
``x_i`` to a master and broadcasts ``c``; an all-reduce with ``c`` replicated on every rank is the
equivalent, deterministic form). Only the center update needs the sum, and the center is first
needed at the next round, so the all-reduce runs asynchronously under the next ``tau`` local steps
(co-design 4: overlap) and is waited for at the start of the next round. Every operation is
deterministic, so two runs with the same seed give bitwise identical weights.

The local steps are the user's optimizer (plain SGD by default, as in the paper).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tether.comm.reducer import AllReducer, PendingReduce
from tether.methods.base import Backward, StepTimes, TrainingMethod
from tether.methods.default_rates import SYNC_EASGD_HELD, own_batch_rate
from tether.methods.elastic import ELASTIC_SETTINGS, elastic_rate
from tether.methods.flat import flatten_parameters
from tether.methods.replicated import REDUCER_SETTINGS, broadcast_parameters, run_reducer
from tether.observe.metrics import PhaseTotals


class SyncEASGD(TrainingMethod):
    """Default lr 0.4, tau 1: 85% test accuracy on LeNet-5 / Fashion-MNIST, 4 workers, in
    14.7-17.8 s (580 steps) against 14.3-18.4 s with tau 4 (638 steps) and 22.8-30.0 s at
    lr 0.2; 0.8 diverged (benchmarks/results/method_defaults_sweep.md).
    """

    name = "sync-easgd"
    per_rank_state = True
    defaults = own_batch_rate(0.4, held=SYNC_EASGD_HELD)
    settings = REDUCER_SETTINGS | ELASTIC_SETTINGS | {"overlap", "single_message"}
    composes_with_model_parallel = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # TrainingMethod's arguments
        super().__init__(*args, **kwargs)
        self.flat = flatten_parameters(self.model)
        # The center is a model of its own (evaluated and saved); its parameters view ``center``.
        self.center_model = copy.deepcopy(self.model)
        self.center = flatten_parameters(self.center_model)
        self.alpha = elastic_rate(self.config, self.elastic_workers())
        self.rounds = 0
        self.reducer = self.round_reducer()
        self._pending: list[PendingReduce] | None = None  # the in-flight all-reduce(s) of sum d_i
        self._sum = torch.zeros_like(self.flat)

    def elastic_workers(self) -> int:
        """The replicas that average elastically (each rank's)."""
        return self.transport.world_size

    def round_reducer(self) -> AllReducer:
        """What sums the rounds' differences (over every rank)."""
        return run_reducer(self.context)

    def start(self, step: int = 0) -> None:
        super().start(step)
        broadcast_parameters(self.center_model, self.transport)
        if not self.own_replica_restored:
            broadcast_parameters(self.model, self.transport)

    def step(self, backward: Backward, times: StepTimes) -> torch.Tensor | None:
        loss = self.local_update(backward, times)
        if self.local_step % self.config.tau == 0:
            times.waited(*self._complete_round())
            self._sum = self.flat - self.center  # d_i, with the center every rank holds
            self.flat.sub_(self._sum, alpha=self.alpha)  # the worker moves now
            self._pending = self._all_reduce_async(self._sum)
            self.rounds += 1
            if not self.config.overlap:
                times.waited(*self._complete_round())
        return loss

    def overflow_sharing(self) -> Callable[[torch.Tensor], None] | None:
        """fp16: the workers reduce no gradients, so their overflow flags are all-reduced with
        MAX every step and all of them skip the same step (their rounds stay in lockstep)."""
        return lambda flag: self.transport.all_reduce(flag, op="max")

    def _all_reduce_async(self, flat: torch.Tensor) -> list[PendingReduce]:
        """One message of the whole vector, or (co-design switch off) one per layer."""
        if self.config.single_message:
            return [self.reducer.start(flat, average=False)]
        pieces, offset = [], 0
        for p in self.model.parameters():
            pieces.append(flat[offset : offset + p.numel()])
            offset += p.numel()
        return [self.reducer.start(piece, average=False) for piece in pieces]

    def _complete_round(self) -> tuple[float, float]:
        """Wait for the last round's sum and move the center; returns when the wait began and
        ended (an empty interval when no round was in flight: no clock read, which on CUDA
        would synchronise the device for nothing)."""
        if self._pending is None:
            return 0.0, 0.0
        start = self.clock()
        self._finish_sum(self._pending)
        self._pending = None
        end = self.clock()
        self.center.add_(self._sum, alpha=self.alpha)
        return start, end

    def _finish_sum(self, pending: list[PendingReduce]) -> None:
        """Wait until ``self._sum`` holds the round's sum on this rank."""
        for handle in pending:
            handle.wait()

    def finish(self, totals: PhaseTotals | None) -> None:
        del totals
        self._complete_round()
        self.reducer.close()

    def summary_extra(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "alpha": self.alpha, "tau": self.config.tau}

    def eval_model(self) -> nn.Module:
        """The center, with the round still in flight applied (a local wait: every rank
        started it, and the next round then has nothing left to wait for)."""
        self._complete_round()
        return self.center_model

    def state_dict(self) -> dict[str, Any]:
        self._complete_round()
        return {**super().state_dict(), "center": self.center.clone(), "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # From its own shard a worker keeps its replica (loaded with the model); from rank 0's
        # state alone (a resume with another number of workers) it restarts from the center,
        # with rank 0's optimizer state.
        super().load_state_dict(state)
        self.center.copy_(state["center"])
        if not state.get("own_replica", False):
            self.flat.copy_(state["center"])
        self.rounds = int(state["rounds"])
