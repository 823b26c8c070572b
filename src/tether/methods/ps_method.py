"""Base class of the methods with a server process (async SGD/MSGD, the EASGD family).

Rank 0 is the server and holds the evaluated model (the center variable, or the global weights);
ranks 1..P are the computing workers. The trainer runs the step loop on workers and calls
:meth:`ServerMethod.serve` on the server, which reports progress through :class:`ServerHooks` so
the trainer can evaluate, checkpoint and show progress while the server serves.
"""

from __future__ import annotations

import copy
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from tether.comm.header import MessageKind
from tether.comm.socket_wire import SocketWire
from tether.comm.transport import Message
from tether.comm.wire_setup import open_socket_wire
from tether.errors import WorkerFailure
from tether.methods.base import Backward, Role, StepTimes, TrainingMethod
from tether.methods.flat import flatten_parameters
from tether.methods.own_failure import tolerate_own_failure, withdraw
from tether.methods.ps_server import ServerEndpoint
from tether.methods.ps_worker import WorkerEndpoint
from tether.methods.server_end_watch import ServerEndWatch, own_failure_wanted, watch_wanted
from tether.observe.metrics import PhaseTotals
from tether.observe.pulse_mark import WHILE_SERVING, watching_self


class ServerHooks(Protocol):
    def on_progress(self, global_step: int, consistent: bool = True) -> bool:
        """Called by the server after each update; returns True when the run should stop.
        ``consistent``: every worker's state belongs to this point (not mid-round under
        round-robin, where the workers keep their own state): checkpoints are taken only there.
        """
        ...

    def on_worker_loss(
        self, rank: int, worker_step: int, loss: float, steps: int, global_step: int | None = None
    ) -> None:
        """A worker's mean training loss over its ``steps`` local steps up to ``worker_step``;
        ``global_step``: the run's as the server counts it now, where it knows better than the
        last progress it reported (Hogwild's, after an evaluation its workers trained on)."""
        ...


@dataclass
class ServeResult:
    totals: PhaseTotals
    global_step: int
    lost_workers: dict[int, str]
    extra: dict[str, Any] = field(default_factory=dict)  # method counters for summary.json
    # The final step of each worker that said goodbye (the lost ones are not in it).
    finished_steps: dict[int, int] = field(default_factory=dict)

    def summary_extra(self) -> dict[str, Any]:
        """The method's counters and the lost workers, for summary.json."""
        lost = [{"rank": rank, "reason": why} for rank, why in self.lost_workers.items()]
        return {**self.extra, "lost_workers": lost}

    def check_complete(self, total_steps: int, stopped_at_target: bool) -> None:
        """Fail a run that did not do its work (its results are written first, by the caller):
        every worker lost, or no worker reached the step budget although the target did not
        stop the run. Losing some workers is not a failure: the others carry on and finish."""
        reached = [s for s in self.finished_steps.values() if s >= total_steps]
        if reached or stopped_at_target:
            return
        lost = ", ".join(f"rank {rank} ({why})" for rank, why in self.lost_workers.items())
        if not self.finished_steps:
            raise WorkerFailure(
                f"every worker was lost, the run stopped at step {self.global_step} of "
                f"{total_steps}: {lost}",
                sorted(self.lost_workers),
            )
        raise WorkerFailure(
            f"no worker reached the step budget ({total_steps}; the furthest stopped at "
            f"{max(self.finished_steps.values())})" + (f"; lost: {lost}" if lost else ""),
            sorted(self.lost_workers),
        )


class ServerMethod(TrainingMethod):
    """A method whose rank 0 serves the model to workers 1..P over point-to-point messages."""

    server_processes: ClassVar[int] = 1
    # Made by open_wire at start: the connections, and the server's or a worker's end of them.
    wire: SocketWire
    server: ServerEndpoint
    link: WorkerEndpoint
    # Asynchronous methods carry on when a worker dies; a strict round-robin cannot.
    tolerates_worker_loss: ClassVar[bool] = True
    # The server's exchanges cross sockets through host memory and it joins no NCCL collective:
    # it needs no GPU of its own, so a node's GPUs go to its workers first (launch.worker.place).
    gpu_free_server: ClassVar[bool] = True
    # A worker's learning-rate schedule follows the run's global step (which the server sends
    # with every reply), not the worker's own count: a slow worker uses the run's rate.
    schedule_per_step: ClassVar[bool] = False
    # Whether the server applies every update with its own optimizer (async-sgd, async-msgd):
    # a worker's optimizer then only carries the settings, never steps.
    updates_on_server: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # TrainingMethod's arguments
        super().__init__(*args, **kwargs)
        self.flat = flatten_parameters(self.model)
        self.is_server = self.transport.rank == 0
        self._eval_copy: nn.Module | None = None  # a worker's copy of the server's model
        self._eval_flat = self.flat
        self._end_watch: ServerEndWatch | None = None  # a worker with no supervisor (torchrun)
        # Called on a worker with the step after each exchange's message is sent (fault
        # injection: see WorkerEndpoint.on_sent).
        self.on_sent: Callable[[int], None] | None = None
        # The server's updates (serve_loop) over the whole run: its subclasses checkpoint them,
        # so a resumed run's summary counts the rounds before the checkpoint too.
        self.updates = 0

    def shard_after(self, step: int) -> bool:
        """Whether this worker's state after its step ``step`` belongs to a point the server
        may checkpoint at, for a method whose workers checkpoint their own state
        (``per_rank_state``); the trainer saves the worker's shard there."""
        del step
        return False

    def max_step_jump(self) -> int:
        """How far a worker's step may move between two of its messages (tau steps; a header
        that goes back or jumps further is a broken or hostile peer, given up on)."""
        return self.config.tau

    def open_wire(self) -> None:
        """Connect the server and its workers (collective: every rank, at start).

        The messages travel on their own connections, not on the process group's
        point-to-point (:mod:`tether.comm.socket_wire`: a peer must not be able to abort the
        server); the group carries only the set-up's scatter."""
        self.wire = open_socket_wire(
            lambda tensor, parts: self.transport.scatter(tensor, parts, 0),
            self.transport.rank,
            self.transport.world_size,
            self.config.timeout_s,
            self.context.placement.server_address,
        )
        if self.is_server:
            # A worker silent this long after the server's reply is hung: the run goes on
            # without it.
            self.server = ServerEndpoint(
                self.wire,
                self.flat,
                silence_timeout_s=self.config.timeout_s,
                max_step_jump=self.max_step_jump(),
                tolerant=self.tolerates_worker_loss,
            )
        else:
            self.link = WorkerEndpoint(self.wire, self.flat)
            self.link.on_sent = self.on_sent

    def arm_end_watch(self) -> None:
        """A worker that has joined, with no supervisor to end it should the run give it up
        and finish without it (torchrun, srun, mpiexec): :mod:`~tether.methods.server_end_watch`;
        nor to keep its own failure from the launcher: :mod:`~tether.methods.own_failure`."""
        if not self.is_server and self.tolerates_worker_loss and watch_wanted():
            self._end_watch = ServerEndWatch(self.link, self.transport.rank)
            if own_failure_wanted():
                tolerate_own_failure(self.link, self.transport.rank, self.config.method)

    def disarm_end_watch(self) -> None:
        if self._end_watch is not None:
            withdraw()
            self._end_watch.stop()
            self._end_watch = None

    def keep_waiting(self) -> None:
        """Called by the serving thread between evaluation batches: the workers waiting for a
        reply hear that the server is busy (``ServerEndpoint.keep_waiting``)."""
        self.server.keep_waiting()

    def start(self, step: int = 0) -> None:
        """Handshake: the server checks each worker's model and sends it the (restored) weights."""
        super().start(step)
        self.open_wire()
        if self.is_server:
            self.server.handshake(self.flat, step)
        else:
            initial = self.link.handshake()
            if not self.own_replica_restored:  # a worker resumed from its shard keeps its own
                self.flat.copy_(initial)
            self.advance_schedule(step, resumed=True)  # a resumed run continues its schedule
            self.arm_end_watch()

    def role(self) -> Role:
        return Role.SERVER if self.is_server else Role.WORKER

    def computing_workers(self) -> int:
        return self.transport.world_size - 1

    def worker_index(self) -> int:
        return self.transport.rank - 1

    @property
    def stop_requested(self) -> bool:
        return not self.is_server and self.link.stop_requested

    def local_update(
        self,
        backward: Backward,
        times: StepTimes,
        wait: Callable[[], tuple[float, float]] | None = None,
    ) -> torch.Tensor | None:
        """The step seam, and the step's loss kept for the server's log (reported with the
        next message; a user's own loop, which runs backward itself, reports none)."""
        loss = super().local_update(backward, times, wait)
        if loss is not None:
            self.note_loss(float(loss))
        return loss

    def note_loss(self, loss: float) -> None:
        self.link.note_loss(loss)

    @abstractmethod
    def serve(self, hooks: ServerHooks) -> ServeResult:
        """The server's loop; returns when every worker has stopped or was lost."""

    def finish(self, totals: PhaseTotals | None) -> None:
        self.disarm_end_watch()  # leaving on its own, before its wire closes
        if not self.is_server:
            self.link.goodbye(totals or PhaseTotals(), self.local_step)
            self.wire.close_after_sending()  # the server reads the goodbye, then the end

    def eval_model(self) -> nn.Module:
        """The server's model; on a worker (a user's own loop calls this), a copy holding the
        server's current vector, fetched with one PULL message."""
        if self.is_server:
            return self.model
        vector = self.link.fetch(in_step=False)
        if vector is None:  # stopped: the server no longer answers
            return self.model
        if self._eval_copy is None:
            self._eval_copy = copy.deepcopy(self.model)
            self._eval_flat = flatten_parameters(self._eval_copy)
        self._eval_flat.copy_(vector)
        return self._eval_copy

    def result(self, **extra: Any) -> ServeResult:
        """What the server reports once serving is over (called at the end of every serve)."""
        self.server.settle()
        state = self.server.state
        finished = {rank: state.local_steps.get(rank, 0) for rank in sorted(state.stopped)}
        return ServeResult(state.totals, state.global_step(), dict(state.lost), extra, finished)

    def serve_loop(
        self,
        hooks: ServerHooks,
        arrivals: Iterable[Message],
        before_reply: Callable[[Message], None],
        after_reply: Callable[[Message], None] | None = None,
        round_end: Callable[[Message], bool] | None = None,
    ) -> int:
        """For each arrival: ``before_reply``, send the server's weights back, ``after_reply``,
        report progress; once the hooks ask to stop, answer every arrival with a stop.

        The split lets EASGD reply with the center *before* its elastic update (the worker needs
        the same ``c`` the server used) without copying it. ``round_end(msg)``: whether ``msg``
        ends a round (round-robin), the only points consistent for a checkpoint; None: every
        point is. Returns the updates applied in the whole run (``updates``).

        The loop watches its own pulse (:func:`~tether.observe.pulse_mark.watch_self`, where no
        supervisor does): a worker's last reply may go out before the loop hangs (in an
        evaluation, a save, a deadlock), and its goodbye waits for no answer, so nobody would
        be left waiting for the server to notice. Its patience is its workers': one that
        computes reads the server's last "busy" up to a step later (a step is shorter than
        the timeout, or the worker is given up as silent) and then waits a timeout, so a pulse
        still for twice the timeout is one no worker would still wait for.
        """
        who, timeout_s = f"server rank {self.transport.rank}", self.config.timeout_s
        with watching_self(who, timeout_s, WHILE_SERVING, patience=2.0):
            stopping = False
            for msg in arrivals:
                rank = msg.header.sender
                if msg.header.loss_steps:
                    hooks.on_worker_loss(
                        rank, msg.header.step, msg.header.loss, msg.header.loss_steps
                    )
                if msg.header.kind is MessageKind.PULL:  # a worker reads the vector (eval_model)
                    self.server.reply(rank, self.flat, stop=stopping)
                    continue
                if stopping:
                    self.server.reply(rank, self.flat, stop=True)
                    continue
                before_reply(msg)
                self.server.reply(rank, self.flat)
                if after_reply is not None:
                    after_reply(msg)
                self.updates += 1
                consistent = round_end is None or round_end(msg)
                began = time.perf_counter()  # the server's own work: its workers' pause
                stopping = hooks.on_progress(self.server.state.global_step(), consistent)
                self.server.busy_s += time.perf_counter() - began
            return self.updates
