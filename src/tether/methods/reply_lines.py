"""The parameter server's replies, one line per worker, so that a stalled worker stalls nothing.

A worker that is alive but not reading (stopped by SIGSTOP, swapped out, stuck in a user's code)
leaves the server's reply to it in the kernel's socket buffers; once they are full, the send
blocks. Blocking the server's one serving thread there would stop every other worker. So the
serving thread never waits on a reply: it snapshots the payload, posts the send, and hands the
pending send to the worker's own line thread, which writes it (on the socket wire a send's bytes
are written by whoever waits for it). A reply that stays pending longer than the
run's timeout means the worker stopped reading: the server gives up on that worker alone (its
thread stays blocked, harmless, until the process exits).

The order of the paper's protocol is unchanged (You, Buluc, Demmel, SC17, section 4): a worker
sends only after it has received the previous reply, so each line holds at most one reply.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from typing import Any

import torch

from tether.comm.comm_thread import CommThread
from tether.comm.header import MessageKind
from tether.comm.messages import MessageProtocol

# Longer than any run: a thread that may rightly wait on a peer must never time out (see above).
LISTEN_TIMEOUT = datetime.timedelta(days=365)


class ReplyLine:
    """The replies to one worker: posted by the serving thread, waited for on this line's own
    thread (a :class:`~tether.comm.comm_thread.CommThread`)."""

    def __init__(self, rank: int, on_failure: Callable[[int, str], None]) -> None:
        self.rank = rank
        self._on_failure = on_failure
        self._thread = CommThread(name=f"tether-reply-{rank}")
        self._pending: tuple[float, Future] | None = None  # (posted at, its wait)
        self.last_completed: tuple[float, float] | None = None  # (posted at, written at)

    def post(self, send: Any, posted: float, tracked: bool = True) -> None:
        """Have this line's thread write ``send``, after what was posted before. An untracked
        send (a BUSY, no reply) is neither the reply in flight nor the last one completed: the
        server's watch for a worker that stopped reading or went silent counts replies only."""

        def wait() -> None:
            try:
                send.wait(LISTEN_TIMEOUT)
            except Exception as exc:  # the peer's connection closed: the worker died
                self._on_failure(self.rank, str(exc).splitlines()[0][:200] if str(exc) else "")
            if tracked:
                self.last_completed = (posted, time.monotonic())

        future = self._thread.submit(wait)
        if tracked:
            self._pending = (posted, future)

    def overdue_s(self, now: float) -> float:
        """How long the reply in flight has been waiting to be read (0 when none is)."""
        pending = self._pending
        if pending is None or pending[1].done():
            return 0.0
        return now - pending[0]

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until the reply in flight (if any) was sent; False when it was not in time."""
        pending = self._pending
        if pending is None:
            return True
        return not futures_wait([pending[1]], timeout=max(0.0, timeout_s)).not_done

    def close(self) -> None:
        self._thread.close(timeout_s=0.0)  # a hung worker's line stays blocked: do not wait


class ReplyLines:
    """A :class:`ReplyLine` per worker, and the snapshot every reply is sent from."""

    def __init__(
        self, transport: MessageProtocol, workers: list[int], on_failure: Callable[[int, str], None]
    ) -> None:
        self.transport = transport
        self.lines = {rank: ReplyLine(rank, on_failure) for rank in workers}

    def post(
        self,
        rank: int,
        payload: torch.Tensor,
        kind: MessageKind,
        step: int,
        tracked: bool = True,
        busy_s: float = 0.0,
    ) -> None:
        """Send ``payload`` to ``rank`` without waiting for it to be read. The payload is copied
        first: the server goes on changing its vector while the bytes are on their way.
        ``tracked=False``: a message that is no reply (see :meth:`ReplyLine.post`). ``busy_s``:
        the server's seconds of its own work so far, in the header."""
        snapshot = payload.detach().clone()
        send = self.transport.isend_message(snapshot, rank, kind, step, loss=(busy_s, 0))
        self.lines[rank].post(send, time.monotonic(), tracked)

    def overdue(self, limit_s: float) -> dict[int, float]:
        """Workers whose reply has waited more than ``limit_s`` to be read, with how long."""
        now = time.monotonic()
        late = {rank: line.overdue_s(now) for rank, line in self.lines.items()}
        return {rank: waited for rank, waited in late.items() if waited > limit_s}

    def last_completed(self, rank: int) -> tuple[float, float] | None:
        """When the last reply to ``rank`` was posted, and when its writing ended (the worker
        read it): this line's thread notes the latter, possibly after the worker answered."""
        return self.lines[rank].last_completed

    def drain(self, ranks: list[int], timeout_s: float) -> list[int]:
        """Wait (``timeout_s`` in all) for the replies to ``ranks``; returns those not sent."""
        deadline = time.monotonic() + timeout_s
        unsent = [r for r in ranks if not self.lines[r].wait_idle(deadline - time.monotonic())]
        for line in self.lines.values():
            line.close()
        return unsent
