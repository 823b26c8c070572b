"""The method protocol: what a training method owns and what it leaves to the trainer.

A *method* (sync SGD, the EASGD family, parameter-server SGD, ...) owns how a worker steps and
communicates: the local update, what crosses the wire and when, and which model is the one to
evaluate (the center variable for EASGD). The *trainer* owns everything around it: data and
sharding, the step loop, evaluation, logging, checkpoints and timing.

Ranks play roles. In data-parallel methods every rank is a WORKER. Parameter-server methods make one
rank a SERVER that computes no gradients; the trainer calls :meth:`TrainingMethod.serve` there
instead of running the step loop.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.observe.metrics import PhaseTotals


class Role(enum.Enum):
    WORKER = "worker"
    SERVER = "server"


@dataclass
class StepTimes:
    """Seconds one step spent in each phase, filled in by the method (data is the trainer's)."""

    compute_s: float = 0.0
    comm_s: float = 0.0  # communication that was NOT hidden under computation
    # When those waits happened (``time.perf_counter`` start and end, as :meth:`waited` records
    # them), so that the timeline shows them where they were instead of laying durations out in
    # order: one preemption of a few milliseconds inside a step is enough for a layout by
    # durations to put sync SGD's wait after its update.
    comm_spans: list[tuple[float, float]] = field(default_factory=list)

    def waited(self, start: float, end: float) -> None:
        """Count the exposed communication from ``start`` to ``end`` (method clock readings)."""
        self.comm_s += end - start
        if end > start:
            self.comm_spans.append((start, end))


@dataclass(frozen=True)
class MethodContext:
    """Runtime objects a method is built with (never part of a config: DESIGN.md convention 1)."""

    config: TrainConfig
    transport: TorchTransport
    device: torch.device


class TrainingMethod(ABC):
    """Base class of every method. Subclasses are registered in :data:`tether.methods.METHODS`."""

    name: ClassVar[str]
    # Extra processes beyond the computing workers (a parameter server takes one).
    server_processes: ClassVar[int] = 0
    # Whether the workers stand still while the model is evaluated (collective evaluation, or a
    # server that does not answer while it evaluates). Only then is evaluation time left out
    # of the training time in the history.
    evaluation_pauses_workers: ClassVar[bool] = True
    # Config values this method uses unless the user sets them (tuned per method: see the
    # method's docstring for the measurement behind them).
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, model: nn.Module, context: MethodContext) -> None:
        self.model = model
        self.context = context
        self.config = context.config
        self.transport = context.transport
        self.local_step = 0  # steps this worker has taken, counted from the start of the run

    def clock(self) -> float:
        """``time.perf_counter()`` once the device has run what was queued: CUDA kernels run
        asynchronously, so without the synchronisation a GPU step's compute time would be the
        time to launch its kernels and its wait would absorb the computation (on the CPU this
        is the plain clock)."""
        if self.context.device.type == "cuda":
            torch.cuda.synchronize(self.context.device)
        return time.perf_counter()

    # Roles --------------------------------------------------------------------------------------
    def role(self) -> Role:
        return Role.WORKER

    def computing_workers(self) -> int:
        """How many ranks compute gradients (reported as ``workers`` in summary.json)."""
        return self.transport.world_size

    def worker_index(self) -> int:
        """This rank's index among the computing workers (used for data sharding)."""
        return self.transport.rank

    def start(self, step: int = 0) -> None:
        """Called once on every rank after a checkpoint (if any) was loaded and before the first
        step, which is ``step`` (non-zero on resume): make the replicas consistent (broadcast,
        handshake with a server). Subclasses call ``super().start(step)``."""
        self.local_step = step

    @property
    def stop_requested(self) -> bool:
        """True when this worker was told to stop early (e.g. the target accuracy was reached)."""
        return False

    # The step -----------------------------------------------------------------------------------
    @abstractmethod
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor, times: StepTimes) -> float:
        """One local step on this worker's batch: forward, backward, communicate, update.
        Returns the local loss."""

    def serve(self, hooks: Any) -> Any:  # pragma: no cover - only server-based methods override it
        raise NotImplementedError(f"{self.name} has no server role")

    def finish(self, totals: PhaseTotals | None) -> None:
        """Called once after the last step on every worker (final synchronisation); ``totals``
        are this worker's timings, which server-based methods report to the server."""
        del totals

    # What is evaluated and checkpointed ----------------------------------------------------------
    def eval_model(self) -> nn.Module:
        """The model to evaluate and save. Called on every rank at the same points, so it may
        communicate (e.g. to average batch-norm statistics or fetch the center variable)."""
        return self.model

    def summary_extra(self) -> dict[str, Any]:
        """Method counters for summary.json (e.g. ``rounds`` of communication)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Method state beyond the model weights (optimizer momentum, center variable, ...)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state
