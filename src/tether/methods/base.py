"""The method protocol: what a training method owns and what it leaves to its caller.

A *method* (sync SGD, the EASGD family, parameter-server SGD, ...) owns how a worker communicates
around its optimizer step: what crosses the wire and when, and which model is the one to evaluate
(the center variable for EASGD). It does not own the loss, the data or the optimizer: its caller
(Tether's trainer, or a user's own loop through ``tether.init``) computes the loss and its
backward pass, and the local update is always a ``torch.optim.Optimizer`` step over the model's
parameters (the one step seam). So any model, loss, optimizer and schedule work with any method.

One step, as the caller drives it::

    method.zero_grad()
    loss = method.step(backward, times)   # backward() runs forward + backward (or nothing, when
                                          # the caller already ran them) and returns the loss

Ranks play roles. In data-parallel methods every rank is a WORKER. Parameter-server methods make
one rank a SERVER that computes no gradients; the caller runs :meth:`TrainingMethod.serve` there
instead of the step loop.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import nn

from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.methods.flat import check_one_buffer
from tether.methods.step_times import StepTimes
from tether.observe.metrics import PhaseTotals
from tether.optim import LOCAL_STEPS, OptimizerSettings, check_distributable, needs_closure
from tether.optim.schedule_resume import (
    ScheduleStart,
    follow_schedule,
    load_schedule_state,
    step_schedule_to,
)
from tether.optim.schedules import check_schedule
from tether.parallel.grid import ProcessGrid
from tether.parallel.norms import clip_grad_norm_ as clip_sharded_grad_norm_
from tether.parallel.norms import reduce_trust_norms, shared_over
from tether.precision import LossScaler, Precision, ScalerSettings

# How far one report of the global step may move a worker's schedule (each step of a
# scheduler is a few microseconds of Python: a bound keeps a bad value from stalling a worker).
MAX_SCHEDULE_ADVANCE = 100_000

Backward = Callable[[], "torch.Tensor | None"]
"""Runs forward and backward on this step's batch and returns the loss (or does nothing and
returns None when the caller already did: a user's own loop)."""


class Role(enum.Enum):
    WORKER = "worker"
    SERVER = "server"


@dataclass(frozen=True)
class Placement:
    """Facts about where this process runs, from the launcher (only
    :mod:`tether.launch.env` reads the environment; everything else gets these as values)."""

    local_world_size: int | None = None  # ranks on this node; None: every rank is on this node
    run_id: str | None = None  # the launch's id (names the Hogwild shared-memory files)
    cache_dir: Path | None = None  # where measurements are cached (collective calibration)
    # How the node's cores are split among its ranks (summary.json's ``partition``:
    # tether.launch.partition.Partition.summary); None where nobody planned it.
    partition: dict[str, Any] | None = None
    # Where a parameter server listens for its workers' connections (tether.comm.wire_setup).
    server_address: str = "127.0.0.1"

    def ranks_on_node(self, world_size: int) -> int:
        return self.local_world_size if self.local_world_size is not None else world_size


@dataclass(frozen=True)
class MethodContext:
    """Runtime objects a method is built with (never part of a config). Under model
    parallelism ``transport`` is the data-parallel group's and ``grid`` the whole grid."""

    config: TrainConfig
    transport: TorchTransport
    device: torch.device
    placement: Placement = field(default_factory=Placement)
    grid: ProcessGrid | None = None


class TrainingMethod(ABC):
    """Base class of every method (the table of names is :data:`tether.methods.METHODS`).

    Built with the model (already on its device), the optimizer over its parameters (the method's
    own local step when None: :attr:`local_step_name`) and optionally a learning-rate scheduler
    over that optimizer, which the method steps: once per optimizer step, or for asynchronous
    methods on the global update count.
    """

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
    # The local step when the user names no optimizer (``--optimizer auto``): a name of
    # :data:`tether.optim.LOCAL_STEPS`.
    local_step_name: ClassVar[str] = "plain-sgd"
    # The method-specific config keys it reads (among tether.methods.METHOD_SETTINGS): setting
    # another one warns that it has no effect.
    settings: ClassVar[frozenset[str]] = frozenset()
    # Whether the ranks' replicas differ between synchronisations (EASGD, local SGD): then every
    # rank checkpoints its own replica and optimizer (a shard), so that a resume with the same
    # workers continues exactly; else rank 0's state stands for all.
    per_rank_state: ClassVar[bool] = False
    # Whether the method runs over the data-parallel axis of a data x model grid
    # (tether.parallel): every model group of K ranks then acts as one of its workers, over
    # the context's transport, which is the data-parallel group's.
    composes_with_model_parallel: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module,
        context: MethodContext,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        self.check_model(model)
        self.model = model
        self.context = context
        self.config = context.config
        self.transport = context.transport
        if optimizer is None:
            optimizer = self.build_default_optimizer(model.parameters(), self.config)
        check_distributable(optimizer)
        if context.grid is not None:  # LARS/LAMB: a split tensor's norm is its group's
            reduce_trust_norms(model, optimizer)
        self.optimizer = optimizer
        self.scheduler = check_schedule(scheduler)
        self.precision = Precision(self.config.precision)
        self.scaler: LossScaler | None = None
        if self.precision.scales_loss:
            if needs_closure(optimizer):
                raise TetherError(
                    f"{type(optimizer).__name__} takes its gradient inside step(), where fp16's "
                    "loss scale cannot be checked: use bf16, or another optimizer"
                )
            sharing = self.overflow_sharing()
            if context.grid is not None:  # a slice's overflow is the whole model group's
                sharing = shared_over(context.grid.model, sharing)
            self.scaler = LossScaler(ScalerSettings.of(self.config), sharing, self.transport.rank)
        self.local_step = 0  # optimizer steps this worker has taken, counted from the run start
        self.own_replica_restored = False  # set by load_state_dict from a rank's own shard
        # Multiplies the gradient before the update: 1/k under gradient accumulation over k
        # backward passes (set by the caller).
        self.grad_scale = 1.0

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        """Refuse a model the method cannot hold: its weights in one flat buffer."""
        check_one_buffer(model, cls.name)

    @classmethod
    def build_default_optimizer(
        cls, params: Iterable[torch.Tensor], config: TrainConfig
    ) -> torch.optim.Optimizer:
        return LOCAL_STEPS[cls.local_step_name](params, OptimizerSettings.of(config))

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
    def zero_grad(self) -> None:
        """Clear the gradients before the next backward pass."""
        self.optimizer.zero_grad(set_to_none=True)

    @abstractmethod
    def step(self, backward: Backward, times: StepTimes) -> torch.Tensor | None:
        """One local step: ``backward()`` (forward and backward, or nothing if the caller ran
        them), communication, the update. Returns what ``backward`` returned."""

    def local_update(
        self,
        backward: Backward,
        times: StepTimes,
        wait: Callable[[], tuple[float, float]] | None = None,
    ) -> torch.Tensor | None:
        """The step seam: backward, then ``wait`` for the gradients' communication (its
        interval is exposed communication), the gradients' accumulation scale, fp16's unscaling
        and overflow check, clipping, then the optimizer's step and the schedule's. A step whose
        gradients overflowed (fp16) is skipped: no update, no schedule step.

        An optimizer that evaluates the loss itself (EAMSGD's look-ahead) gets all that as its
        closure; others step after it, so the timeline times the update alone."""
        overflow = False

        def closure() -> torch.Tensor | None:
            nonlocal overflow
            loss = backward()
            if wait is not None:
                times.waited(*wait())
            self.scale_gradients()
            overflow = self.unscale_gradients()
            if not overflow:
                self.clip_gradients()
            return loss

        if needs_closure(self.optimizer):
            # torch's stubs type the closure's result as float; any loss value is passed back
            loss = cast(Any, self.optimizer).step(closure)
        else:
            loss = closure()
            if not overflow:
                self.optimizer.step()
        if self.scaler is not None:
            self.scaler.update(overflow)
        self.local_step += 1
        if self.scheduler is not None and self.schedule_per_step and not overflow:
            self.scheduler.step()
        return loss

    # -- mixed precision -----------------------------------------------------------------------
    def backward_loss(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, of the scaled loss under fp16 (what ``ctx.backward`` does)."""
        (self.scaler.scale_loss(loss) if self.scaler is not None else loss).backward()

    def overflow_sharing(self) -> Callable[[torch.Tensor], None] | None:
        """How this rank's fp16 overflow flag reaches the others: None (each worker decides
        alone), or a MAX all-reduce over the ranks that must skip together."""
        return None

    def gradients_to_unscale(self) -> list[torch.Tensor]:
        return [p.grad for p in self.model.parameters() if p.grad is not None]

    def unscale_gradients(self) -> bool:
        """fp16: divide the gradients by the loss scale; True when they overflowed (the step is
        then skipped). Always False in fp32 and bf16."""
        if self.scaler is None:
            return False
        if not self.scaler.scaled:
            raise TetherError(
                "with precision fp16 the loss must be scaled before backward: call "
                "ctx.backward(loss) instead of loss.backward()"
            )
        return self.scaler.unscale(self.gradients_to_unscale())

    # Synchronous methods step their schedule with every optimizer step; asynchronous ones
    # follow the global update count instead (:meth:`advance_schedule`).
    schedule_per_step: ClassVar[bool] = True

    def advance_schedule(self, global_step: int, resumed: bool = False) -> None:
        """Step the scheduler until it has seen ``global_step`` updates (asynchronous methods:
        the count of the whole run, so a slow worker's rate is the run's, not its own).
        ``resumed``: the step is the run's own checkpoint's, where a resumed worker starts, not
        one a server reported (which may move the schedule only so far at once)."""
        if self.scheduler is None:
            return
        if not resumed and global_step - self.scheduler.last_epoch > MAX_SCHEDULE_ADVANCE:
            raise TetherError(
                f"the server reported global step {global_step} while this worker's schedule "
                f"stands at {self.scheduler.last_epoch}: a broken or hostile server"
            )
        step_schedule_to(self.scheduler, global_step)

    def scale_gradients(self) -> None:
        if self.grad_scale == 1.0:
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, self.grad_scale)

    def clip_gradients(self) -> None:
        """Clip the gradient's global norm to ``clip_grad_norm`` (torch's
        ``clip_grad_norm_``): called after the gradients' communication, so the replicas of a
        synchronous method clip identical gradients alike."""
        max_norm = self.config.clip_grad_norm
        if max_norm is None:
            return
        if self.context.grid is not None:
            clip_sharded_grad_norm_(self.model, max_norm)  # the norm of every slice together
        else:
            grads = [p for p in self.model.parameters() if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(grads, max_norm)

    def set_gradient_sync(self, enabled: bool) -> None:
        """Whether the next backward pass is the last one before an optimizer step (gradient
        accumulation turns it off for the passes in between); methods that communicate during
        backward skip that communication when it is off."""
        del enabled

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
        """Method state beyond the model weights: the optimizer's and scheduler's, and the
        method's own (center variable, counters, ...). Subclasses extend it."""
        state = self.optimizer_state()
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def optimizer_state(self) -> dict[str, Any]:
        """This rank's optimizer and fp16 loss scale alone: what an asynchronous worker keeps
        across a resume (its weights come from the server, its schedule from the global step)."""
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict()}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:  # restored with the method's: its rate, not the save's
            follow_schedule(self.scheduler)
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # From a rank's own checkpoint shard (see per_rank_state): start() keeps its replica.
        self.own_replica_restored = bool(state.get("own_replica", False))
        # the schedule as this run built it: a restore comes before any step
        start = ScheduleStart(self.scheduler) if self.scheduler is not None else None
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and "scheduler" in state:
            load_schedule_state(self.scheduler, state["scheduler"], start)
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
