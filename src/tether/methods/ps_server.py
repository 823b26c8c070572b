"""The server side of Tether's parameter-server protocol (used by the async and EASGD methods).

Rank 0 is the server: it holds the center variable (EASGD) or the global weights (async SGD) and
computes no gradients; ranks 1..P are the workers. Every exchange is ONE message of the flat
parameter vector over the header-checked point-to-point protocol.

Order of service (You, Buluc, Demmel, SC17, section 4):
- first come, first served: one receiver thread per worker queues that worker's arrivals; the
  main thread applies them one at a time, in arrival order (serialized updates), and replies. A
  thread per worker, not one receiving from any source: a worker that sends a header and never
  its payload then stalls only its own thread (and is given up as silent), not every worker's;
- round-robin: the main thread receives from rank 1, 2, ..., P in turn; a worker that is ready
  waits for its predecessors, which is the cost the paper's redesign removes.

Messages travel on the socket wire (:mod:`tether.comm.socket_wire`): one connection per worker
and channel, so that a peer can neither abort the server (as a message longer than a gloo receive
does) nor stall anything but its own connection.

Liveness: each worker gets a watch thread blocked on a second channel; the worker releases it
with a goodbye when it finishes, and a crash closes that connection ("closed its connection"),
which tells the server precisely who was lost (after reading what the worker sent before it
died). The watch and the receivers wait with ``LISTEN_TIMEOUT``, not the run's timeout: they may
rightly wait a whole run. A worker that is alive but silent (hung) is noticed instead by the
first-come-first-served loop: once the server's reply to it was sent, it has
``silence_timeout_s`` to send its next message; a reply it does not read for that long (a stopped
process) gives it up too. Replies never block the serving thread
(:mod:`tether.methods.reply_lines`), so a stalled worker costs only itself. As serving ends, each
worker given up as silent gets an END on its liveness channel, the one message ever sent there
(:mod:`tether.methods.server_end_watch`: one with no supervisor then ends itself if it is stuck).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import torch

from tether.comm.header import DTYPE_CODES, MessageKind
from tether.comm.messages import Message, MessageProtocol
from tether.errors import TetherError
from tether.methods.ps_state import ServerState, WorkerLost
from tether.methods.reply_lines import LISTEN_TIMEOUT, ReplyLines
from tether.methods.server_end_watch import say_given_up
from tether.observe.metrics import PhaseTotals
from tether.observe.pulse_mark import awake, waiting

DATA_CHANNEL = 0
WATCH_CHANNEL = 1
HELLO_WORDS = 2  # numel, dtype code
TOTALS_WORDS = 5  # PhaseTotals fields, float64
# How long the report of a dead worker waits for its receiver to read what the worker sent
# before it died (its data arrived before the end of its stream: reading it is local work, once
# serving has begun).
DRAIN_S = 5.0


class ServerEndpoint:
    """Handshake, arrivals (FCFS or round-robin), replies, and worker liveness on the server."""

    def __init__(
        self,
        transport: MessageProtocol,
        params: torch.Tensor,
        silence_timeout_s: float | None = None,
        max_step_jump: int = 1,
        tolerant: bool = False,
    ) -> None:
        self.transport = transport
        self.params = params
        # whether the run goes on without a worker lost before its first exchange (the
        # asynchronous methods), or fails naming it (round-robin: every worker has its turn)
        self.tolerant = tolerant
        self.state = ServerState(workers=list(range(1, transport.world_size)))
        # A worker's step grows by its communication period between two of its messages: a
        # header that goes back, or jumps further, is a broken or hostile peer (given up on).
        self.max_step_jump = max_step_jump
        self._events: queue.Queue = queue.Queue()
        self._receiving = False
        self._receivers_started = threading.Event()  # set once every receiver thread runs
        # Per worker rank: its liveness watch, and (FCFS) its receiver.
        self._threads: dict[tuple[str, int], threading.Thread] = {}
        # Liveness of workers that are alive but silent (FCFS only): when each last sent to us
        # (receiver thread); the reply lines know when our replies were read.
        self.silence_timeout_s = silence_timeout_s
        self._heard: dict[int, float] = {}
        self._busy_sent = -float("inf")  # when keep_waiting last told the workers
        # Seconds of the server's own work between replies so far (evaluations, checkpoints:
        # the serving loop counts them), in each reply's header for the workers' timing.
        self.busy_s = 0.0
        self._told_to_stop: set[int] = set()  # they read nothing more
        # Round-robin only: a worker's next message (or what reading it raised), taken in by
        # keep_waiting before its turn, while the server evaluates (see _read_ahead).
        self._round_robin = False
        self._ahead: dict[int, Message | Exception] = {}
        self.lines = ReplyLines(
            transport, self.state.workers, lambda rank, why: self._events.put(WorkerLost(rank, why))
        )

    # -- start -----------------------------------------------------------------------------------
    def handshake(self, initial: torch.Tensor, step: int = 0) -> None:
        """Check every worker's model against ours, then send it the initial weights.

        A worker built with another model (parameter count) or precision (dtype) is refused here,
        with a message naming it, before any parameter-sized message is exchanged.
        """
        hello = torch.zeros(HELLO_WORDS, dtype=torch.int64)
        expect = (self.params.numel(), DTYPE_CODES[self.params.dtype])
        for rank in self.state.workers:
            try:
                msg = self.transport.recv_message(
                    hello, src=rank, kinds=frozenset({MessageKind.HELLO})
                )
            except (ConnectionError, TimeoutError) as exc:  # died or stopped before its HELLO
                if not self.tolerant:
                    raise
                self.give_up(rank, f"lost before its first exchange: {str(exc)[:200]}")
                continue
            if msg.header.length != HELLO_WORDS:
                raise TetherError(
                    f"worker rank {rank} sent a HELLO of {msg.header.length} words, not "
                    f"{HELLO_WORDS} (a broken peer, or another version of Tether)"
                )
            numel, code = (int(v) for v in msg.payload.tolist())
            if (numel, code) != expect:
                raise TetherError(
                    f"worker rank {rank} has a model of {numel} parameters (dtype code {code}); "
                    f"the server's has {expect[0]} (dtype code {expect[1]}): start every process "
                    "with the same --model, --dataset and precision"
                )
        for rank in self.state.workers:
            self.state.local_steps[rank] = step  # where every worker starts (resume: not 0)
            if rank not in self.state.lost:
                self.lines.post(rank, initial, MessageKind.PARAMS, 0)
        for rank in self.state.active:
            watcher = threading.Thread(target=self._watch, args=(rank,), daemon=True)
            self._threads["watch", rank] = watcher
            watcher.start()

    def _watch(self, rank: int) -> None:
        try:
            self.transport.recv_message(
                torch.zeros(0, dtype=torch.int64),
                src=rank,
                kinds=frozenset({MessageKind.STOP}),
                channel=WATCH_CHANNEL,
                timeout=LISTEN_TIMEOUT,
            )
        except Exception as exc:  # the peer's connection closed: the worker died
            # Its data connection is another stream: what it sent there before dying is
            # still to be read, by its receiver thread (which reads up to the end of that
            # stream), once serving has started them.
            deadline = time.monotonic() + DRAIN_S
            self._receivers_started.wait(DRAIN_S)
            receiver = self._threads.get(("receive", rank))
            if receiver is not None:
                receiver.join(max(0.0, deadline - time.monotonic()))
            self._events.put(WorkerLost(rank, str(exc).splitlines()[0][:200]))

    # -- arrivals --------------------------------------------------------------------------------
    def _buffers(self) -> dict[MessageKind, torch.Tensor]:
        # A fresh buffer per arrival: the main thread may still be applying the previous one.
        # The wire fills exactly what a header announced, and a data message must announce the
        # whole vector (_accept), so no old memory is ever read. One vector serves both kinds:
        # one message arrives per call.
        vector = torch.empty_like(self.params)
        return {
            MessageKind.PARAMS: vector,
            MessageKind.GRADIENT: vector,
            MessageKind.PULL: torch.empty(0, dtype=self.params.dtype),
            MessageKind.STOP: torch.empty(TOTALS_WORDS, dtype=torch.float64),
        }

    def _receive_from(self, rank: int) -> None:
        # Post receives only while the worker may still send: once it said STOP (or was lost)
        # the thread ends instead of waiting forever in a receive.
        while rank not in self.state.lost:
            try:
                msg = self.transport.recv_message(self._buffers(), src=rank, timeout=LISTEN_TIMEOUT)
            except TetherError as exc:  # a malformed message: a broken or hostile peer
                self._events.put(WorkerLost(rank, f"protocol: {exc}"))
                return
            except Exception:
                return  # its connection closed: the worker died, and its watch reports it
            self._heard[rank] = time.monotonic()
            self._events.put(msg)
            if msg.header.kind is MessageKind.STOP:
                return

    def _start_receiving(self) -> None:
        if not self._receiving:
            self._receiving = True
            for rank in self.state.workers:
                thread = threading.Thread(target=self._receive_from, args=(rank,), daemon=True)
                self._threads["receive", rank] = thread
                thread.start()
            self._receivers_started.set()

    def _next_event(self, timeout: float | None) -> Message | None:
        """The next data message, after book-keeping any goodbye, loss or protocol error;
        None when ``timeout`` passed or the event needed no action from the method."""
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(event, WorkerLost):
            self._mark_lost(event)
        elif isinstance(event, Exception):
            raise event
        elif self._accept(event):
            return event
        return None

    def arrivals_fcfs(self) -> Iterator[Message]:
        """Yield data messages in arrival order until every worker stopped or was lost."""
        self._start_receiving()
        silence = self.silence_timeout_s
        while self.state.active:
            msg = self._next_event(timeout=None if silence is None else min(1.0, silence / 4))
            awake()  # between messages: the serving thread's own watch (pulse_mark)
            if msg is not None:
                yield msg
            if silence is not None:
                self._lose_silent(silence)

    def _lose_silent(self, silence: float) -> None:
        """Mark lost every worker that has not read our reply for ``silence`` seconds, or has
        sent nothing for as long after reading it: it is hung (a dead one is reported by its
        watch). Its later messages are ignored."""
        for rank, waited in self.lines.overdue(silence).items():
            reason = f"did not read the server's reply for {waited:.0f} s (hung or stopped?)"
            self.give_up_silent(rank, reason)
        now = time.monotonic()
        for rank in self.state.active:
            reply = self.lines.last_completed(rank)  # heard after its post: an answer to it
            if reply is None or self._heard.get(rank, -1.0) >= reply[0]:
                continue  # a reply is in flight, or we owe it one: it is waiting for us
            if now - reply[1] > silence:
                reason = f"sent nothing for {now - reply[1]:.0f} s after the server's reply (hung?)"
                self.give_up_silent(rank, reason)

    def poll(self, timeout: float) -> list[Message]:
        """For servers that exchange no data messages (Hogwild on shared memory): wait up to
        ``timeout`` seconds for goodbyes and losses; returns any data messages that arrived."""
        self._start_receiving()
        msg = self._next_event(timeout)
        return [msg] if msg is not None else []

    def arrivals_round_robin(self) -> Iterator[Message]:
        """Yield data messages from rank 1, 2, ..., P, 1, ... strictly in that order."""
        self._round_robin = True
        while self.state.active:
            for rank in list(self.state.active):
                ahead = self._ahead.pop(rank, None)
                if isinstance(ahead, Exception):
                    raise ahead
                if ahead is None:
                    with waiting():  # bounded by the wire's timeout, not stillness
                        ahead = self.transport.recv_message(self._buffers(), src=rank)
                msg = ahead
                if self._accept(msg):
                    yield msg

    def _read_ahead(self) -> None:
        """Round-robin reads a worker's message only in its turn, and no thread reads before:
        during an evaluation a worker whose message is larger than the socket buffers (a few MB)
        would wait in its send until the run's timeout gave it up. Each message a worker has
        begun is taken in here (one per worker: it sends the next only after its reply) and
        served in its turn as before; what the read raised is raised in that turn."""
        for rank in self.state.active:
            if rank in self._ahead or not self.transport.has_data(rank, DATA_CHANNEL):
                continue
            try:
                self._ahead[rank] = self.transport.recv_message(self._buffers(), src=rank)
            except Exception as exc:  # a dead or broken worker: its turn reports it
                self._ahead[rank] = exc

    def _accept(self, msg: Message) -> bool:
        """Book-keeping for every arrival; True for a data message the method must apply."""
        rank = msg.header.sender
        if rank in self.state.lost:
            return False  # given up on as hung; its late messages change nothing
        if msg.header.kind is MessageKind.PULL:
            # A read of the server's vector; with a step (a worker whose gradients all
            # overflowed) it also reports how far the worker has come.
            if msg.header.step and self.plausible_step(rank, msg.header.step):
                self.state.local_steps[rank] = msg.header.step
            return rank not in self.state.lost
        if not self.plausible_step(rank, msg.header.step):
            return False
        expected = TOTALS_WORDS if msg.header.kind is MessageKind.STOP else self.params.numel()
        if msg.header.length != expected:
            why = f"its {msg.header.kind.name} has {msg.header.length} elements, not {expected}"
            self.give_up(rank, f"protocol: {why} (a broken peer)")
            return False
        if msg.header.kind is MessageKind.STOP:
            totals = msg.payload
            if not bool(torch.isfinite(totals).all()) or bool((totals < 0).any()):
                # its time and sample counts go into the run's summary: NaN or inf crashed the
                # server (int() of them), a negative count corrupted the summary
                self.give_up(rank, "protocol: its goodbye's totals are negative or not finite")
                return False
            self.state.stopped.add(rank)
            self.state.totals = self.state.totals + PhaseTotals.from_tensor(totals)
            # The goodbye carries the worker's final step: steps after its last exchange count.
            self.state.local_steps[rank] = msg.header.step
            return False
        self.state.local_steps[rank] = msg.header.step
        self.state.arrivals.append(rank)
        return True

    def plausible_step(self, rank: int, step: int) -> bool:
        """Whether ``step`` can follow the worker's last one; if not, the worker is given up on
        (its step counts drive the run's progress, evaluation and schedule)."""
        last = self.state.local_steps.get(rank, 0)
        if last <= step <= last + self.max_step_jump:
            return True
        self.give_up(rank, f"protocol: its step went from {last} to {step} (a broken peer)")
        return False

    def give_up(self, rank: int, reason: str) -> None:
        """Count ``rank`` as lost (its later messages change nothing); the run goes on."""
        self._mark_lost(WorkerLost(rank, reason))

    def give_up_silent(self, rank: int, reason: str) -> None:
        """The same for a worker that fell silent (hung or stopped): it hears so at the end."""
        if rank not in self.state.stopped and rank not in self.state.lost:
            self.state.silent.add(rank)
        self._mark_lost(WorkerLost(rank, reason))

    def _mark_lost(self, event: WorkerLost) -> None:
        if event.rank not in self.state.stopped and event.rank not in self.state.lost:
            self.state.lost[event.rank] = event.reason

    def settle(self, timeout_s: float = 5.0) -> None:
        """Wait (up to ``timeout_s`` in all) for the threads that are about to end: the replies,
        receiver and watch of every worker that said goodbye, whose second STOP may still be in
        flight, then close the connections. (A hung worker's threads end with its connections.)"""
        deadline = time.monotonic() + timeout_s
        self.lines.drain(sorted(self.state.stopped), timeout_s)
        for (_, rank), thread in self._threads.items():
            if rank in self.state.stopped:
                thread.join(max(0.0, deadline - time.monotonic()))
        # the silent ones' last word: one with no supervisor ends itself if it is stuck
        say_given_up(self.transport, sorted(self.state.silent), WATCH_CHANNEL)
        self.transport.close()

    # -- replies ---------------------------------------------------------------------------------
    def keep_waiting(self) -> None:
        """Tell every active worker that the server is busy, at most every quarter of the run's
        timeout: called by the serving thread between the batches of an evaluation, which may
        take longer than a worker waits for its reply. A waiting worker reads the BUSY and waits
        anew (a computing one skips it at its next receive). Sent between batches, not by a
        timer, so that a server that hangs stops sending them and its workers still give it
        up. Not counted as replies: a worker that stops reading is still noticed."""
        now = time.monotonic()
        every = self.silence_timeout_s
        if every is None or now - self._busy_sent < every / 4:
            return
        self._busy_sent = now
        step = self.state.global_step()
        for rank in self.state.active:
            if rank in self._told_to_stop:  # may have closed its connections: a write would fail
                continue
            try:
                self.lines.post(rank, self.params[:0], MessageKind.BUSY, step, tracked=False)
            except Exception as exc:  # died meanwhile: its watch says so as well
                self._mark_lost(WorkerLost(rank, str(exc).splitlines()[0][:200]))
        if self._round_robin:
            self._read_ahead()

    def reply(self, rank: int, payload: torch.Tensor, stop: bool = False) -> None:
        """Send ``payload`` to ``rank``, or tell it to stop, with the run's global step in the
        header (workers follow it with their learning-rate schedule). The send does not wait to
        be read (see :mod:`tether.methods.reply_lines`); one to a worker that died in the
        meantime marks it lost instead of failing the server."""
        if rank in self.state.lost:
            return
        kind = MessageKind.STOP if stop else MessageKind.PARAMS
        if stop:
            self._told_to_stop.add(rank)
        step = self.state.global_step()
        try:
            self.lines.post(
                rank, payload if not stop else payload[:0], kind, step, busy_s=self.busy_s
            )
        except Exception as exc:
            self._mark_lost(WorkerLost(rank, str(exc).splitlines()[0][:200]))
