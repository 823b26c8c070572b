"""hogwild-easgd: EASGD whose center variable is updated without any lock (You, Buluc, Demmel,
SC17, "Hogwild EASGD"; Zhang, Choromanska, LeCun, NIPS 2015; Recht et al., NIPS 2011).

Each worker keeps its own flat ``x_i`` and takes local optimizer steps (plain SGD by default,
``x_i <- x_i - lr*(g + wd*x_i)``). Every ``tau`` steps it does the elastic exchange with the center ``c``: ``d = x_i - c``,
``x_i <- x_i - alpha*d``, ``c <- c + alpha*d`` (``alpha`` from ``--alpha``/``--rho``, else the
EASGD paper's ``0.9/P``). As in async-easgd no worker ever waits for another; unlike async-easgd,
the center's updates are not serialized.

On one node (every rank on this node, :func:`~tether.methods.hogwild_base.single_node`) the center
lives in shared memory and each worker does the exchange itself: it reads the live ``c``, computes
``d``, moves ``x_i`` and adds ``alpha*d`` into the shared ``c`` in place. No message is sent; the
exchanges of two workers may interleave element by element. Rank 0 only evaluates ``c`` and
watches progress and liveness (:mod:`tether.methods.hogwild_base`).

Across nodes (LOCAL_WORLD_SIZE != WORLD_SIZE) shared memory cannot span the ranks, so the center
stays on rank 0 and is updated lock-free by threads: one server thread per worker receives that
worker's ``x_i`` (one PARAMS message per exchange, on its own channel), computes ``d = x_i - c``
with ``c`` as it is at that moment, adds ``alpha*d`` to ``c`` and replies with ``d`` (one DELTA
message); the worker applies ``x_i <- x_i - alpha*d``. The threads update ``c`` concurrently with
no lock, so two arrivals may interleave just as on one node. Replying ``d`` rather than ``c`` keeps
the worker's move the exact opposite of the center's, even when another thread changed ``c`` in
between, and the thread never sends a tensor that others are writing. The center moves before the
reply, so a finished exchange is always already in ``c``. Setting the class attribute
``shared_memory`` forces either mode (the tests run the threaded one on one node).
"""

from __future__ import annotations

import copy
import sys
import threading
import time
from typing import Any, ClassVar

import torch
from torch import nn

from tether.comm.header import MessageKind, ProtocolError
from tether.errors import TetherError
from tether.methods.base import Backward, StepTimes
from tether.methods.default_rates import own_batch_rate
from tether.methods.elastic import ELASTIC_SETTINGS, elastic_rate
from tether.methods.flat import flatten_parameters
from tether.methods.hogwild_base import HogwildMethod, single_node
from tether.methods.loss_board import LossBoard
from tether.methods.ps_method import ServeResult, ServerHooks
from tether.methods.reply_lines import LISTEN_TIMEOUT
from tether.observe.metrics import PhaseTotals

EXCHANGE_CHANNEL = 2  # the threaded exchanges; 0 (data) and 1 (liveness) belong to ps_server
SERVER = 0
JOIN_S = 5.0  # a server thread ends with its worker's last message or the loss of its connection


class HogwildEASGD(HogwildMethod):
    """Default lr 0.4, tau 1: fastest to 85% test accuracy on LeNet-5 / Fashion-MNIST, 4 workers,
    12.3-12.7 s against 13.6-13.8 s with tau 4 and 16-19 s at lr 0.2; 0.8 diverged
    (benchmarks/results/method_defaults_sweep.md).
    """

    name = "hogwild-easgd"
    defaults = own_batch_rate(0.4)
    settings = ELASTIC_SETTINGS
    shared_name = "center"
    # None: shared memory when every rank is on one node, server threads otherwise.
    shared_memory: ClassVar[bool | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.use_shared = (
            single_node(self.context) if self.shared_memory is None else self.shared_memory
        )
        if self.use_shared:
            self.require_cpu()
        config = self.config
        self.alpha = elastic_rate(config, self.workers)
        self.tau = config.tau
        self.center: torch.Tensor | None = None  # a worker's mapping of the shared center
        self._stop = torch.empty(0, dtype=self.flat.dtype)  # STOP messages carry nothing
        threaded_worker = not (self.use_shared or self.is_server)
        self._delta = torch.empty_like(self.flat) if threaded_worker else self._stop
        # Threaded server: one slot per worker, each written by that worker's thread only.
        self._steps = [0] * self.workers
        self._exchanges = [0] * self.workers
        self.exchanges_before = 0  # the checkpoint's count: a resumed run counts from it
        self._center_copy: nn.Module | None = None  # a worker's view of the center (eval_model)

    def start(self, step: int = 0) -> None:
        if not self.use_shared:
            super().start(step)  # the plain handshake: x_i starts at the server's c
            self._steps = [step] * self.workers
            if self.is_server:  # the threads fill it from the workers' headers
                self.losses = LossBoard(torch.zeros(LossBoard.size(self.workers)).double())
            return
        center = self.start_shared(step)
        if not self.is_server:
            self.center = center
            assert self.initial is not None
            self.flat.copy_(self.initial)

    # -- worker ----------------------------------------------------------------------------------
    def step(self, backward: Backward, times: StepTimes) -> torch.Tensor | None:
        loss = self.local_update(backward, times)
        self.note_step()
        if self.local_step % self.tau == 0:
            start = self.clock()
            self.exchange()
            times.waited(start, self.clock())
        return loss

    def exchange(self) -> None:
        """The elastic exchange: in shared memory, or with a server thread."""
        if self.center is not None:
            d = self.flat - self.center  # one read of the live c: both moves use this d
            self.flat.sub_(d, alpha=self.alpha)
            self.center.add_(d, alpha=self.alpha)  # in place on the shared c, no lock
            assert self.board is not None
            self.board[self.workers + self.worker_index()] += 1
            return
        buffers = {MessageKind.DELTA: self._delta, MessageKind.STOP: self._stop}
        with self.link.exchanging():
            self.wire.send_message(
                self.flat,
                SERVER,
                MessageKind.PARAMS,
                step=self.local_step,
                channel=EXCHANGE_CHANNEL,
                loss=self.link.take_loss(),
            )
            msg = self.wire.recv_message(buffers, src=SERVER, channel=EXCHANGE_CHANNEL)
        if msg.header.kind is MessageKind.STOP:
            self.link.stop_requested = True
        else:
            self._check_whole(msg.header.length, "the server's DELTA")
            self.flat.sub_(msg.payload, alpha=self.alpha)
            self.advance_schedule(msg.header.step)

    def eval_model(self) -> nn.Module:
        """The server's model is the center; a worker (a user's own loop) sees the live shared
        center, or (server threads) a copy fetched from its thread."""
        if self.is_server:
            return self.model
        if self._center_copy is None:
            self._center_copy = copy.deepcopy(self.model)
            if self.center is not None:  # every parameter a view of the shared center
                flatten_parameters(self._center_copy, storage=self.center)
        if self.center is None and not self.link.stop_requested:
            empty = self._stop
            buffers = {MessageKind.PARAMS: torch.empty_like(self.flat), MessageKind.STOP: empty}
            with self.link.exchanging():
                self.wire.send_message(empty, SERVER, MessageKind.PULL, channel=EXCHANGE_CHANNEL)
                msg = self.wire.recv_message(buffers, src=SERVER, channel=EXCHANGE_CHANNEL)
            if msg.header.kind is MessageKind.STOP:
                self.link.stop_requested = True
            else:
                self._check_whole(msg.header.length, "the server's center")
                flatten_parameters(self._center_copy, storage=msg.payload)
        return self._center_copy

    def finish(self, totals: PhaseTotals | None) -> None:
        self.disarm_end_watch()  # leaving on its own, before anything is sent
        if not self.is_server and not self.use_shared:
            # Releases this worker's server thread and tells it the final step count.
            self.wire.send_message(
                self._stop, SERVER, MessageKind.STOP, self.local_step, EXCHANGE_CHANNEL
            )
        super().finish(totals)

    # -- server ----------------------------------------------------------------------------------
    def serve(self, hooks: ServerHooks) -> ServeResult:
        if self.use_shared:
            self.watch(hooks, self.board_steps)
        else:
            self.beat()  # the threads measure the serving thread's stillness from here
            threads = [
                threading.Thread(target=self._serve_worker, args=(rank,), daemon=True)
                for rank in self.server.state.workers
            ]
            for thread in threads:
                thread.start()
            self.watch(hooks, self._thread_steps)
            for thread in threads:
                thread.join(JOIN_S)
        return self.result(
            tau=self.tau,
            alpha=self.alpha,
            exchanges=self.exchanges(),
            shared_memory=self.use_shared,
        )

    def exchanges(self) -> int:
        """The elastic exchanges of the whole run so far (the server's count)."""
        if self.use_shared:  # each worker counts its own on the board
            assert self.board is not None
            return self.exchanges_before + int(self.board[self.workers : 2 * self.workers].sum())
        return self.exchanges_before + sum(self._exchanges)

    def _thread_steps(self) -> list[int]:
        return list(self._steps)

    def _serve_worker(self, rank: int) -> None:
        """One worker's exchanges, concurrently with the other workers' threads."""
        slot = rank - 1
        buffers = {
            MessageKind.PARAMS: torch.empty_like(self.flat),
            MessageKind.PULL: self._stop,
            MessageKind.STOP: self._stop,
        }
        try:
            while True:
                # No timeout: a worker may rightly take long between exchanges; the watch gives
                # up on a worker whose step count stops moving.
                msg = self.wire.recv_message(
                    buffers, src=rank, channel=EXCHANGE_CHANNEL, timeout=LISTEN_TIMEOUT
                )
                if self._serving_stood_still(rank):
                    return
                if msg.header.kind is MessageKind.PULL:  # the worker reads c (eval_model)
                    self._send(self.flat.clone(), rank, MessageKind.PARAMS)  # a still copy
                    continue
                if msg.header.kind is MessageKind.PARAMS:
                    self._check_whole(msg.header.length, "its PARAMS")
                last, step = self._steps[slot], msg.header.step
                if not last <= step <= last + self.tau:  # a worker takes tau steps per message
                    self.server.give_up(rank, f"protocol: its step went from {last} to {step}")
                    return
                self._steps[slot] = step
                if msg.header.loss_steps:  # this slot's own words of the loss board
                    assert self.losses is not None
                    loss_sum = msg.header.loss * msg.header.loss_steps
                    self.losses.add(slot, loss_sum, msg.header.loss_steps)
                if msg.header.kind is MessageKind.STOP:
                    return
                if self.stopping:
                    self._send(self._stop, rank, MessageKind.STOP)
                    continue
                d = msg.payload.sub_(self.flat)  # d = x_i - c, with c as it is right now
                self.move_center(d)
                self._send(d, rank, MessageKind.DELTA)
                self._exchanges[slot] += 1
        except TetherError as exc:  # a malformed message: a broken or hostile peer, given up
            self.server.give_up(rank, f"protocol: {exc}")
        except Exception:
            return  # the worker's connection closed: its liveness watch reports the loss

    def _serving_stood_still(self, rank: int) -> bool:
        """Whether the serving thread's pulse (:meth:`beat`: its watch, each evaluation batch,
        around a save) stood still for --timeout: it hangs, and this thread stops answering
        ``rank``, whose wait for its reply then runs out and gives the server up. Answering on,
        the threads would let the workers train to their end beside a server that never ends
        the run (under torchrun, which has no supervisor, for ever)."""
        still = time.monotonic() - self.beaten
        if still <= self.config.timeout_s:
            return False
        print(
            f"tether: server rank 0's serving thread stood still for {still:.0f} s (hung?): it "
            f"stops answering worker rank {rank}",
            file=sys.stderr,
            flush=True,
        )
        return True

    def _check_whole(self, length: int, what: str) -> None:
        """A vector message must hold the whole model: a shorter one (the receive buffer takes
        any length up to it) would fail the exchange's arithmetic half-way, or (a view) silently
        leave part of the model behind."""
        if length != self.flat.numel():
            if not self.is_server:  # the server is broken: not this worker's own failure
                self.link.failed = True
            raise ProtocolError(f"{what} has {length} elements, not {self.flat.numel()}")

    def _send(self, payload: torch.Tensor, rank: int, kind: MessageKind) -> None:
        """Reply on the exchange channel, with the run's global step in the header (the worker's
        learning-rate schedule follows it)."""
        global_step = sum(self._steps) // self.workers
        # Waits without the run's timeout, for the same reason as the receive above.
        send = self.wire.isend_message(payload, rank, kind, global_step, EXCHANGE_CHANNEL)
        send.wait(LISTEN_TIMEOUT)

    def move_center(self, d: torch.Tensor) -> None:
        """``c <- c + alpha*d`` in place, concurrently with the other threads: no lock."""
        self.flat.add_(d, alpha=self.alpha)

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # Written by the server (rank 0): the center is its model; workers restart from it. Its
        # exchanges so far: a resumed run's summary counts the whole run's.
        return {"exchanges": self.exchanges()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.exchanges_before = int(state.get("exchanges", 0))
