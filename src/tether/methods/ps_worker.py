"""The worker side of the parameter-server protocol (see :mod:`tether.methods.ps_server`)."""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Iterator

import torch

from tether.comm.header import DTYPE_CODES, MessageKind
from tether.comm.messages import MessageProtocol
from tether.methods.ps_server import DATA_CHANNEL, HELLO_WORDS, WATCH_CHANNEL
from tether.observe.metrics import PhaseTotals

SERVER = 0


class WorkerEndpoint:
    """A worker's link to the server: handshake, one exchange per call, goodbye."""

    def __init__(self, transport: MessageProtocol, params: torch.Tensor) -> None:
        self.transport = transport
        self.params = params
        self._reply = {
            MessageKind.PARAMS: torch.empty_like(params),
            MessageKind.STOP: torch.empty(0, dtype=params.dtype),
            MessageKind.BUSY: torch.empty(0, dtype=params.dtype),
        }
        self.stop_requested = False
        self.global_step = 0  # the run's global step, as of the server's last reply
        # Called with the step after each exchange's message is sent (fault injection: a worker
        # that stops between its message and the server's reply, as a SIGSTOP can catch it).
        self.on_sent: Callable[[int], None] | None = None
        self._loss_sum = 0.0  # the training losses since the last report (server's log)
        self._loss_steps = 0
        # For the watch of a worker with no supervisor (tether.methods.server_end_watch): the
        # main thread inside an exchange (which ends by its own timeout), or one that failed.
        self.in_exchange = 0
        self.failed = False
        # The server's busy seconds (evaluating, saving) as its last reply said, and the part
        # of this worker's waits since the last take_paused that they explain.
        self._server_busy_s = 0.0
        self._paused_s = 0.0

    @contextlib.contextmanager
    def exchanging(self) -> Iterator[None]:
        """Around each of the main thread's exchanges with the server."""
        self.in_exchange += 1
        try:
            yield
        except BaseException:
            self.failed = True
            raise
        finally:
            self.in_exchange -= 1

    def server_spoke(self) -> bool:
        """Whether the liveness channel has something to read: the server never writes there
        but an END to a worker it gave up (or its connection ended)."""
        return self.transport.has_data(SERVER, WATCH_CHANNEL)

    def told_given_up(self) -> bool:
        """Read the liveness channel (the watch's thread, the main thread never does): True for
        the server's END, False for the end of the connection or anything else."""
        end = torch.empty(0, dtype=torch.int64)
        try:
            msg = self.transport.recv_message(
                end,
                src=SERVER,
                kinds=frozenset({MessageKind.STOP}),
                channel=WATCH_CHANNEL,
                timeout=datetime.timedelta(seconds=2),
            )
        except Exception:
            return False
        return msg.header.kind is MessageKind.STOP

    def note_loss(self, loss: float) -> None:
        """Count one local step's loss; the next exchange reports their mean to the server."""
        self._loss_sum += loss
        self._loss_steps += 1

    def take_loss(self) -> tuple[float, int]:
        """(mean loss, steps) since the last report, for a message header; resets the count."""
        report = (
            (self._loss_sum / self._loss_steps, self._loss_steps) if self._loss_steps else (0.0, 0)
        )
        self._loss_sum, self._loss_steps = 0.0, 0
        return report

    def handshake(self) -> torch.Tensor:
        """Announce our model (count and dtype) and receive the initial weights."""
        hello = torch.tensor(
            [self.params.numel(), DTYPE_CODES[self.params.dtype]], dtype=torch.int64
        )
        assert hello.numel() == HELLO_WORDS
        with self.exchanging():
            self.transport.send_message(hello, SERVER, MessageKind.HELLO)
            return self.exchange_reply()

    def exchange(self, payload: torch.Tensor, kind: MessageKind, step: int) -> torch.Tensor | None:
        """Send ``payload`` (the flat weights or gradient) and return the server's reply, or
        None when the server asks this worker to stop (the target accuracy was reached)."""
        sent = time.perf_counter()
        with self.exchanging():
            self.transport.send_message(
                payload, SERVER, kind, step=step, channel=DATA_CHANNEL, loss=self.take_loss()
            )
        if self.on_sent is not None:  # not an exchange: it ends by no timeout of ours
            self.on_sent(step)
        with self.exchanging():
            reply = self._reply_to(sent)
        return None if self.stop_requested else reply

    def _reply_to(self, sent: float) -> torch.Tensor:
        """The reply to what we sent at ``sent``; the server's own work since its last reply
        to us counted as paused, up to our wait: a wait for the server's evaluation is no
        communication (the workers' comm share counted the server's evaluations). The server
        cannot tell when our message came (it reads none while it evaluates), so an
        evaluation that ran while we computed also takes up to that one wait of ours: an
        overcount of at most one exchange per evaluation."""
        busy_before = self._server_busy_s
        reply = self.exchange_reply()
        busy = self._server_busy_s - busy_before
        self._paused_s += min(busy, time.perf_counter() - sent)
        return reply

    def take_paused(self) -> float:
        """Seconds of this worker's waits since the last call that the server spent on its
        own work (evaluating, saving); resets the count."""
        paused, self._paused_s = self._paused_s, 0.0
        return paused

    def exchange_reply(self) -> torch.Tensor:
        """The server's reply. Each receive waits up to the run's timeout; a BUSY (the server
        is evaluating, see ``ServerEndpoint.keep_waiting``) starts the wait anew."""
        msg = self.transport.recv_message(self._reply, src=SERVER)
        while msg.header.kind is MessageKind.BUSY:
            msg = self.transport.recv_message(self._reply, src=SERVER)
        if msg.header.kind is MessageKind.STOP:
            self.stop_requested = True
        self.global_step = max(self.global_step, msg.header.step)
        self._server_busy_s = max(self._server_busy_s, msg.header.busy_s)
        return msg.payload

    def fetch(self, step: int = 0, in_step: bool = True) -> torch.Tensor | None:
        """The server's current vector (its weights or center), without changing it: a PULL
        message and its reply. None when the server has already stopped this worker. Outside
        a training step (``in_step`` False: ``eval_model``) its wait counts toward no step's
        pause."""
        if self.stop_requested:
            return None
        empty = torch.empty(0, dtype=self.params.dtype)
        sent = time.perf_counter()
        with self.exchanging():
            self.transport.send_message(empty, SERVER, MessageKind.PULL, step, DATA_CHANNEL)
            reply = self._reply_to(sent) if in_step else self.exchange_reply()
        return None if self.stop_requested else reply

    def goodbye(self, totals: PhaseTotals, step: int = 0) -> None:
        """Report this worker's timings, then release the server's liveness watch."""
        self.transport.send_message(
            totals.as_tensor(), SERVER, MessageKind.STOP, step=step, channel=DATA_CHANNEL
        )
        empty = torch.empty(0, dtype=torch.int64)
        self.transport.send_message(empty, SERVER, MessageKind.STOP, channel=WATCH_CHANNEL)
