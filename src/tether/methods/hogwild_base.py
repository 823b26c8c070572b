"""What hogwild-sgd and hogwild-easgd share: one vector in shared memory that every process of the
node maps, a board of counters, and a server that only watches (Recht, Re, Wright, Niu, NIPS 2011;
You, Buluc, Demmel, SC17, "Hogwild EASGD").

Rank 0 creates two files in ``/dev/shm`` (:mod:`tether.methods.shared_memory`): the shared vector
(hogwild-sgd: the weights; hogwild-easgd: the center variable) and a small int64 *board*::

    board[i]        local steps of worker i      (written only by worker i)
    board[P + i]    elastic exchanges of worker i (hogwild-easgd)
    board[2P]       the stop flag                 (written only by the server)
    board[2P + 1]   the server's pulse            (written only by the server)

and a float64 *loss board* (:mod:`tether.methods.loss_board`: per worker the sum of its training
losses, their count and a sequence number), from which the server logs each worker's loss.
Every slot has a single writer, so the boards need no lock either. Start-up: the server creates
and fills the files, sends each worker a random token that names them (one message on a setup
channel, before the ordinary handshake), then runs the handshake. A worker maps the files before
it says hello, so when the handshake is over every process holds its mappings and the server
unlinks the names at once: nothing is left behind in ``/dev/shm`` even if a process is killed.

The server computes nothing. Its model's parameters are views into the shared vector, so the
trainer's evaluation reads the live values. It waits for the workers' goodbyes (which carry their
timings) and watches their liveness through :meth:`ServerEndpoint.poll`, and every ``POLL_S``
publishes ``global_step = sum(local steps) // P`` to the trainer's hooks; when they ask to stop it
raises the flag, which each worker reads after every step. It also counts its pulse on the board
there, and between the batches of an evaluation: a worker, which never waits for the server,
gives up a server whose pulse stands still for the run's timeout (hung), so that a hung server
does not keep the run waiting for ever once its workers are done (:class:`Stillness`, the other
way round).

Across nodes: shared memory spans one node only. :func:`single_node` is the rule: every rank is on
this node when the launcher's LOCAL_WORLD_SIZE equals WORLD_SIZE (processes started without a
launcher, such as the test spawn helper, count as one node).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from tether.comm.header import MAX_STEP, MessageKind
from tether.errors import TetherError
from tether.methods.base import MethodContext
from tether.methods.flat import flatten_parameters
from tether.methods.loss_board import LossBoard
from tether.methods.ps_method import ServerHooks, ServerMethod
from tether.methods.shared_memory import SharedFiles
from tether.observe.pulse_mark import beat as beat_pulse
from tether.observe.pulse_mark import watching_self

# Point-to-point channels: 0 data and 1 liveness (ps_server), 2 hogwild-easgd's threaded exchanges.
SETUP_CHANNEL = 3
# How often the server publishes progress: often enough for the progress bar and evaluation
# points, rare enough that the idle server costs the workers nothing.
POLL_S = 0.015


class Stillness:
    """Which workers' step counts have not moved for ``timeout_s`` (measured from when the
    watch first saw each count)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._since: dict[int, tuple[int, float]] = {}

    def check(self, steps: dict[int, int], active: list[int]) -> dict[int, str]:
        now = self.clock()
        still = {}
        for rank in active:
            step = steps[rank]
            seen = self._since.get(rank)
            if seen is None or seen[0] != step:
                self._since[rank] = (step, now)
            elif now - seen[1] > self.timeout_s:
                still[rank] = f"its step count stayed at {step} for {now - seen[1]:.0f} s (hung?)"
        return still


class ServerPulse:
    """A worker's watch on the server's pulse: the reason to give the server up once the pulse
    has not moved for ``timeout_s`` (measured from when the watch first saw it). The board
    starts at 0 and the server beats first in its watch: until then it is starting (its run
    directory, TensorBoard's writer), and the watch waits for that first beat."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._seen: tuple[int, float] | None = None

    def check(self, pulse: int) -> str:
        now = self.clock()
        if pulse == 0 or self._seen is None or self._seen[0] != pulse:
            self._seen = (pulse, now)
            return ""
        if now - self._seen[1] > self.timeout_s:
            return f"server rank 0's pulse stood still for {now - self._seen[1]:.0f} s (hung?)"
        return ""


def single_node(context: MethodContext) -> bool:
    """True when every rank of the job runs on this node, so shared memory can hold the model."""
    world = context.transport.world_size
    return context.placement.ranks_on_node(world) == world


class HogwildMethod(ServerMethod):
    """A server method whose workers meet in shared memory instead of messages."""

    shared_name: ClassVar[str] = "weights"
    # Its ranks meet in host memory, so its server spares no GPU of the workers'.
    gpu_free_server: ClassVar[bool] = False
    # The shared vector lives in host memory: `--backend auto` runs these methods on the CPU
    # even where the node has GPUs (tether.catalog.method_backend).
    host_memory: ClassVar[bool] = True
    # The workers never wait for the server, so they keep training while it evaluates.
    evaluation_pauses_workers: ClassVar[bool] = False

    # Each worker steps its own schedule to the run's global step, read from the board.
    schedule_per_step: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.workers = self.computing_workers()
        self.board: torch.Tensor | None = None  # None until start, or without shared memory
        # Per worker (sum of losses, count): shared (the workers add to it), or the server's own
        # (filled by its threads from the message headers); None on a worker without one.
        self.losses: LossBoard | None = None
        self.initial: torch.Tensor | None = None  # worker: the server's weights at start
        self.stopping = False
        self.server_pulse = ServerPulse(self.config.timeout_s)  # a worker's watch on the server
        self.beaten = time.monotonic()  # the server's last beat, for its threads without a board

    def max_step_jump(self) -> int:
        # Steps come from the board (this node's shared memory); a goodbye may follow the last
        # reading by any number of steps.
        return MAX_STEP

    def require_cpu(self) -> None:
        if self.context.device.type != "cpu":
            raise TetherError(
                f"{self.name} keeps its shared vector in host memory: run it on CPU "
                "(--backend gloo)"
            )

    # -- start -----------------------------------------------------------------------------------
    def start_shared(self, step: int) -> torch.Tensor:
        """Create (server) or map (worker) the shared vector and the board, then run the
        handshake. Returns the shared vector; a worker finds the initial weights in ``initial``.
        ``step`` is the first step (non-zero on resume); it replaces ServerMethod.start."""
        self.local_step = step
        self.open_wire()
        numel, dtype = self.flat.numel(), self.flat.dtype
        words = 2 * self.workers + 2
        run_id = self.context.placement.run_id
        token = torch.zeros(1, dtype=torch.int64)
        if not self.is_server:
            self.wire.recv_message(
                token, src=0, kinds=frozenset({MessageKind.HELLO}), channel=SETUP_CHANNEL
            )
            files = SharedFiles(run_id, int(token[0]))
            shared = files.attach(self.shared_name, numel, dtype)
            self.board = files.attach("board", words, torch.int64)
            self.board[self.worker_index()] = step
            self.losses = LossBoard(
                files.attach("losses", LossBoard.size(self.workers), torch.float64)
            )
            self.initial = self.link.handshake()
            # A resumed worker's first step takes the schedule's rate at the resumed step (the
            # board moves it only after each step).
            self.advance_schedule(step, resumed=True)
            self.arm_end_watch()
            return shared
        token[0] = secrets.randbits(63)
        files = SharedFiles(run_id, int(token[0]))
        try:
            shared = files.create(self.shared_name, numel, dtype)
            shared.copy_(self.flat)
            self.board = files.create("board", words, torch.int64)
            self.board[: self.workers] = step  # workers resume together at the same step
            losses = files.create("losses", LossBoard.size(self.workers), torch.float64)
            losses.zero_()
            self.losses = LossBoard(losses)
            for rank in self.server.state.workers:
                self.wire.send_message(token, rank, MessageKind.HELLO, channel=SETUP_CHANNEL)
            # The handshake sends the private copy: a worker that already steps on the shared
            # vector cannot tear what a later worker receives.
            self.server.handshake(self.flat, step)
        finally:
            files.unlink()  # every worker mapped the files before its hello
        # The evaluated model now reads the live shared values.
        self.flat = flatten_parameters(self.model, storage=shared)
        return shared

    def beat(self) -> None:
        """The server's sign of life on the board (see :class:`ServerPulse`), for its exchange
        threads where there is none (hogwild-easgd across nodes), and for its own watch."""
        self.beaten = time.monotonic()
        beat_pulse()
        if self.board is not None:
            self.board[2 * self.workers + 1] += 1

    def keep_waiting(self) -> None:
        """Between evaluation batches: the workers do not wait for replies, but they watch the
        server's pulse."""
        self.beat()

    # -- worker ----------------------------------------------------------------------------------
    def note_step(self) -> None:
        """Publish this worker's step count (the optimizer step counted it) where the server
        can see it, and follow the run's global step with the learning-rate schedule."""
        if self.board is not None:
            self.board[self.worker_index()] = self.local_step
            hung = self.server_pulse.check(int(self.board[2 * self.workers + 1]))
            if hung:  # the server's failure, not this worker's own: the launcher's to end
                self.link.failed = True
                raise TetherError(f"{hung}: this worker gives it up")
            if self.scheduler is not None:
                self.advance_schedule(sum(self.board_steps()) // self.workers)

    def note_loss(self, loss: float) -> None:
        """On the loss board where there is one."""
        if self.losses is None:
            super().note_loss(loss)  # reported with the next message
            return
        self.losses.add(self.worker_index(), loss, 1)

    @property
    def stop_requested(self) -> bool:
        if self.is_server:
            return False
        if self.board is not None and bool(self.board[2 * self.workers]):
            return True
        return self.link.stop_requested

    # -- server ----------------------------------------------------------------------------------
    def watch(self, hooks: ServerHooks, local_steps: Callable[[], list[int]]) -> None:
        """Until every worker said goodbye or was lost: collect goodbyes and losses, and publish
        progress every ``POLL_S`` (and once more after the last goodbye). A worker whose step
        count does not move for the run's timeout is hung and given up on: Hogwild workers send
        the server nothing while they train, so their counters are their liveness signal."""
        # Its workers wait for nothing from it and say goodbye without an answer: a serving
        # loop that hangs after their last look at its pulse would keep a launcher without a
        # supervisor of ours (torchrun) waiting for ever. It watches its own pulse, by the
        # workers' rule (still for the timeout: hung), while it serves.
        with watching_self(
            f"server rank {self.transport.rank}",
            self.config.timeout_s,
            "while it served its workers: its pulse on the board (the loop that watches them)",
        ):  # its serving over, ServerProgress watches what follows
            self._watch_workers(hooks, local_steps)

    def _watch_workers(self, hooks: ServerHooks, local_steps: Callable[[], list[int]]) -> None:
        state = self.server.state
        reported = -1
        stillness = Stillness(self.config.timeout_s)
        logged = [(0.0, 0)] * self.workers  # what was reported of each worker: (sum, count)
        while True:
            self.beat()
            done = not state.active  # read before the steps: the final counts get published
            state.local_steps = dict(zip(state.workers, local_steps(), strict=True))
            global_step = state.global_step()
            # at the step their workers have reached (the last progress reported may be an
            # evaluation behind: the workers train on while the server evaluates)
            self._log_losses(hooks, logged, global_step)
            for rank, why in stillness.check(state.local_steps, state.active).items():
                self.server.give_up_silent(rank, why)
            if global_step != reported and not self.stopping:
                reported = global_step
                if hooks.on_progress(global_step):
                    self.stopping = True
                    if self.board is not None:
                        self.board[2 * self.workers] = 1
            if done:
                return
            if self.server.poll(POLL_S):
                raise TetherError(
                    f"a worker sent {self.name}'s server a data message: start every process "
                    "with the same --method"
                )

    def _log_losses(
        self, hooks: ServerHooks, logged: list[tuple[float, int]], global_step: int
    ) -> None:
        """Report each worker's mean loss since the last report (``logged``: what was reported,
        updated here), at the run's ``global_step``."""
        if self.losses is None:
            return
        for i, rank in enumerate(self.server.state.workers):
            pair = self.losses.read(i)
            if pair is None:  # its worker kept writing: next time
                continue
            steps = pair[1] - logged[i][1]
            if steps > 0:
                mean = (pair[0] - logged[i][0]) / steps
                worker_step = self.server.state.local_steps[rank]
                hooks.on_worker_loss(rank, worker_step, mean, steps, global_step)
                logged[i] = pair

    def board_steps(self) -> list[int]:
        assert self.board is not None, "start() maps the board"
        return [int(v) for v in self.board[: self.workers].tolist()]
