"""The context ``tether.init`` returns: this process's place in the run and the method bound to
the user's model and optimizer.

``ctx.wrap(model, optimizer)`` builds the method around them and returns the model and an
optimizer whose ``step()`` carries the method's communication
(:class:`~tether.training.method_optimizer.MethodOptimizer`), so the user's loop stays a
one-process loop. On the server rank of a parameter-server method ``wrap`` serves the workers
until they finish and then ends the process: the server needs the model (its size, the center
it holds) and, for async-sgd, the optimizer that applies the pushed gradients, which exist only
once the user's script has built them, so the server stays in the script up to ``wrap``.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import warnings
from collections.abc import Mapping
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils.data import Dataset

from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data.sharding import WorkerSampler
from tether.errors import TetherError
from tether.ignored_settings import IgnoredSettingWarning, ignored_settings
from tether.launch.env import DistEnv
from tether.launch.lost import said_by_their_supervisors
from tether.launch.teardown import shut_down_process_group
from tether.methods import METHODS, MethodContext, Placement, Role, TrainingMethod
from tether.observe.joined import mark_joined
from tether.observe.left_mark import say_left
from tether.observe.metrics import PhaseTotals
from tether.observe.pulse_mark import start_pulse, stop_watching, watch_self
from tether.parallel import is_parallel, parallelize, parse_plan, sharded_layers
from tether.precision import Precision
from tether.training.method_optimizer import MethodOptimizer
from tether.training.model_parallel import build_grid

ModelT = TypeVar("ModelT", bound=nn.Module)


class _ServeToTheEnd:
    """The server's hooks in a user's own loop: no evaluation, no early stop."""

    def on_progress(self, global_step: int, consistent: bool = True) -> bool:
        del global_step, consistent
        return False

    def on_worker_loss(
        self, rank: int, worker_step: int, loss: float, steps: int, global_step: int | None = None
    ) -> None:
        del rank, worker_step, loss, steps, global_step  # a user's own loop keeps no log of ours


class Context:
    """This process's view of a distributed run started by ``tether.init``."""

    def __init__(
        self,
        config: TrainConfig,
        transport: TorchTransport,
        device: torch.device,
        env: DistEnv,
        placement: Placement,
        own_optimizer_config: TrainConfig | None = None,
        given: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.given = given  # the options tether.init was given (for ctx.wrap's warnings)
        # the run's config for a user's own optimizer (ctx.wrap(model, opt)): without the
        # method's defaults for its own rate (scaling, warm-up, clip), as tether.fit does
        self.own_optimizer_config = own_optimizer_config or config
        self.transport = transport
        self.device = device
        self.env = env
        self.placement = placement
        # Model parallelism: the method and the data shards follow the data-parallel axis.
        self.grid = build_grid(transport, config)
        self.data = self.grid.data if self.grid is not None else transport
        self.method_class = METHODS.get(config.method)
        self.servers = self.method_class.server_processes
        self.method: TrainingMethod | None = None
        self.optimizer: MethodOptimizer | None = None
        self.finished = False

    # -- where this process is -------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def world_size(self) -> int:
        return self.transport.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def workers(self) -> int:
        """Workers that take their own share of each global batch: the processes that compute
        gradients (a parameter server is not one), or under model parallelism the model groups."""
        return self.data.world_size - self.servers

    @property
    def worker_index(self) -> int:
        """This process's index among those workers (the server has none: -1); the ranks of a
        model group share theirs."""
        return self.data.rank - self.servers

    def parallelize(self, model: ModelT, plan: Mapping[str, str] | None = None) -> ModelT:
        """Split ``model``'s layers over this rank's model group (``model_parallel`` in
        ``tether.init``), by ``plan`` (``{"fc1": "column", "fc2": "row"}``; default: the
        ``parallel_plan`` option), in place; call it before building the optimizer. Every rank
        of the group takes its rank 0's full model first (a broadcast) and its random state
        (dropout outside the split layers draws alike), so the ranks need not have seeded
        alike. Save with
        ``tether.parallel.full_state_dict(ctx.eval_model())`` on every rank."""
        if self.grid is None:
            raise TetherError("ctx.parallelize needs tether.init(..., model_parallel=K), K > 1")
        chosen = parse_plan(plan if plan is not None else self.config.parallel_plan)
        parallelize(model, chosen, self.grid.model)
        return model

    @property
    def is_server(self) -> bool:
        return self.servers > 0 and self.rank == 0

    @property
    def is_main(self) -> bool:
        """The process that should print and save: rank 0, or the first worker where rank 0
        is a server (it returns from ``wrap`` only at the end of the run)."""
        return self.rank == self.servers

    # -- the method ------------------------------------------------------------------------------
    def wrap(
        self,
        model: ModelT,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> tuple[ModelT, torch.optim.Optimizer]:
        """Bind the method to ``model`` (moved to ``ctx.device``) and ``optimizer`` (built over
        its parameters; None: the method's own local step from ``lr``, ``momentum``, ...).
        ``scheduler``, when given, is stepped by the method: per optimizer step, or for the
        asynchronous methods on the run's global step (do not step it yourself then).

        Returns ``(model, optimizer)`` to train with: call ``optimizer.zero_grad()``,
        ``loss.backward()`` and ``optimizer.step()`` as usual. On a parameter server's rank it
        serves until every worker has finished, then ends the process (exit status 0)."""
        if self.method is not None:
            raise TetherError("ctx.wrap was called twice: one context binds one model")
        if self.finished:
            raise TetherError("ctx.wrap after ctx.finish: call tether.init again for a new run")
        if self.grid is not None and not is_parallel(model):
            raise TetherError(
                "under model parallelism call model = ctx.parallelize(model) before building "
                "the optimizer and wrapping"
            )
        model.to(self.device)  # in place: an optimizer built over its parameters stays valid
        if optimizer is not None:
            _check_optimizer_covers(model, optimizer)
            self.config = self.own_optimizer_config  # the user's optimizer sets its own rate
            if self.rank == 0:  # where tether.init warned of the rest
                _warn_own_optimizer_ignores(self.config, self.given)
        context = MethodContext(self.config, self.data, self.device, self.placement, self.grid)
        method = self.method_class(model, context, optimizer, scheduler)
        method.start(0)
        mark_joined()  # a worker lost from now on is one the run can carry on without
        self.method = method
        self.optimizer = MethodOptimizer(method, self.config.accumulate)
        if method.role() is Role.SERVER:
            self._serve_and_exit(method)
        atexit.register(self._note_unfinished)
        return model, self.optimizer

    def _note_unfinished(self) -> None:
        """At exit, a worker that never called ``finish`` (and is not ending on an uncaught
        exception, which says more) says what that does to its run, whatever the launcher, and
        ends its process group while Python is whole (:mod:`tether.launch.teardown`: a gloo
        backend alive at finalisation can abort a process that did nothing wrong)."""
        if self.finished or getattr(sys, "last_value", None) is not None:
            return
        self.finished = True
        say_left()  # before its peers lose it: the supervisor names it in the run's report
        lost = (
            "the server counts it lost"
            if getattr(self.method_class, "tolerates_worker_loss", False)
            else "any peer still in the run fails waiting for it"
        )
        print(
            f"tether: worker rank {self.rank} ends without ctx.finish(): {lost}; call "
            "ctx.finish() on every worker after its last step",
            file=sys.stderr,
            flush=True,
        )
        shut_down_process_group()

    def _serve_and_exit(self, method: TrainingMethod) -> None:
        start_pulse(self.config.timeout_s)  # for its supervisor, once the workers have finished
        result = method.serve(_ServeToTheEnd())
        watch_self(
            f"server rank {self.rank}",
            self.config.timeout_s,
            "after every worker had finished: its pulse (its shutdown)",
        )
        said = said_by_their_supervisors(sorted(result.lost_workers))  # each said once
        lost = {r: why for r, why in result.lost_workers.items() if r not in said}
        for rank, reason in sorted(lost.items()):
            print(f"tether: worker rank {rank} was lost ({reason})", file=sys.stderr, flush=True)
        # A run whose every worker was lost did no work: the server's status says so, as the
        # trainer's server fails such a run (its workers may all have left with status 0).
        status = 0 if result.finished_steps or not result.lost_workers else 1
        if status:
            print(
                f"tether: error: server rank {self.rank}: every worker was lost, none said "
                "goodbye (ctx.finish())",
                file=sys.stderr,
                flush=True,
            )
        self.finished = True
        shut_down_process_group()
        stop_watching()
        raise SystemExit(status)

    def sampler(
        self, dataset: Dataset, batch_size: int | None = None, seed: int | None = None
    ) -> WorkerSampler:
        """This worker's samples of ``dataset``: use with ``DataLoader(dataset,
        batch_size=b, sampler=ctx.sampler(dataset, b))`` (``b`` defaults to the config's
        ``batch_size``; each step's batches of all workers together are one global batch of
        ``b * workers`` samples, whatever the worker count). Call ``set_epoch(e)`` each epoch."""
        if self.is_server:
            raise TetherError(
                "the server rank trains on no data: call ctx.sampler after ctx.wrap (on the "
                "server, rank 0, ctx.wrap serves until the workers finish and then ends the "
                "process, so the code after it runs on the workers only)"
            )
        return WorkerSampler(
            len(dataset),  # type: ignore[arg-type]
            batch_size or self.config.batch_size,
            self.worker_index,
            self.workers,
            self.config.seed if seed is None else seed,
        )

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The run's precision for a forward pass: ``with ctx.autocast(): loss = ...``
        (``torch.autocast`` in bf16 or fp16 on ``ctx.device``; nothing in fp32)."""
        return Precision(self.config.precision).autocast(self.device)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``; under fp16 of the loss times the loss scale (the optimizer's
        step then unscales, and skips a step whose gradients overflowed). Use it in place of
        ``loss.backward()`` whatever the precision."""
        self._bound().backward_loss(loss)

    def eval_model(self) -> nn.Module:
        """The model to evaluate and save: the replica (sync-sgd), the mean of the replicas
        (local-sgd), the center variable (EASGD family), the server's weights (async-sgd).
        Call it on every worker at the same point: it may communicate."""
        return self._bound().eval_model()

    @property
    def should_stop(self) -> bool:
        """True when the run was told to stop early (a server that reached its target)."""
        return self.method is not None and self.method.stop_requested

    def finish(self) -> None:
        """End this process's part of the run: the final synchronisation (a worker's goodbye
        to the server), then the process group. Call it once on every worker after training;
        on a context whose ``wrap`` failed (or never ran) it only ends the process group, so
        that ``tether.init`` can start again."""
        if self.finished:
            return
        self.finished = True
        method = self.method
        if method is None:
            shut_down_process_group()
            return
        if self.optimizer is not None:
            self.optimizer.ended = True
        # A worker's goodbye carries timings for a trainer's summary; a user's loop has none.
        method.finish(PhaseTotals() if method.server_processes else None)
        for layer in sharded_layers(method.model).values():
            layer.end()  # a split model cannot run without its group: said in one line
        shut_down_process_group()

    def _bound(self) -> TrainingMethod:
        if self.method is None:
            raise TetherError("call ctx.wrap(model, optimizer) first")
        if self.finished:
            raise TetherError("this run has finished (ctx.finish): its model is no longer served")
        return self.method

    def __repr__(self) -> str:
        role = "server" if self.is_server else f"worker {self.worker_index} of {self.workers}"
        return f"Context({self.config.method}, rank {self.rank}/{self.world_size}, {role})"


def _warn_own_optimizer_ignores(config: TrainConfig, given: frozenset[str]) -> None:
    """The settings given to tether.init that the user's own optimizer makes unused (lr,
    momentum, lr_base_batch, ...), as tether.fit says them; not one init said already."""
    for key in sorted(given):
        if ignored_settings(config, {key}, supplied=["lr_schedule"]):
            continue  # tether.init said it
        for message in ignored_settings(config, {key}, supplied=["optimizer", "lr_schedule"]):
            warnings.warn(message, IgnoredSettingWarning, stacklevel=3)


def _check_optimizer_covers(model: nn.Module, optimizer: Any) -> None:
    """The optimizer must update the model's parameters (a common slip: built before a copy)."""
    ours = {id(p) for p in model.parameters()}
    theirs = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if theirs and not theirs <= ours:
        raise TetherError(
            "the optimizer holds parameters that are not the model's: build it over "
            "model.parameters() of the model you pass to ctx.wrap"
        )
