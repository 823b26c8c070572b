"""Checkpointing a running job and resuming it: rank 0's ``checkpoint.pt`` (the evaluated
model, unsharded, the method's state, the run's record) and, where ranks hold different state,
every rank's own shard (a barrier orders them before rank 0's checkpoint names them). A server's
workers (original-easgd) write theirs as the round the server checkpoints at ends, with no
barrier: a crash in that moment can leave shards of another step than checkpoint.pt. A resume
with the same ranks gives every rank its own shard back, all of them or none (a shard of another
step counts as missing, and rank 0 says so); otherwise every rank starts from rank 0's state
(EASGD workers from the center): the run goes on, no longer bitwise. Each rank's random state
goes where its state goes (rank 0's in checkpoint.pt, each rank's own in its shard) and comes
back once the resumed run has started (training.random_state). So do the phase totals, which a
resumed run's summary counts on from: checkpoint.pt holds every rank's summed (one small
all-reduce per checkpoint), and a server's workers, which report theirs at the end, each keep
their own in their shard.

The workers of the asynchronous methods (no shard of their own: they restart from the server's
weights, and their schedules follow the global step) keep their local optimizer and fp16 loss
scale in theirs, saved every ``checkpoint_every`` of their own steps: a resume with the same ranks
gives each worker its last one back (of its own step, which no other rank's needs to match, as
these methods never line their workers up).

A run that checkpoints also checkpoints its last step (the trainer; a server once its workers
are done), whether or not it is a multiple of ``checkpoint_every``, and the step it stopped at
its target: a finished run resumed has nothing left to do and keeps its results
(training.run_files.keeps_finished), and one resumed with more steps goes on from its end
rather than running its last steps again. original-easgd, whose workers keep shards of their
own at round ends only, does so only where the whole run ends at a round's end."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tether.comm.transport import TorchTransport
from tether.errors import TetherError
from tether.methods import TrainingMethod
from tether.methods.ps_method import ServerMethod
from tether.observe.metrics import PhaseTotals
from tether.parallel import ProcessGrid, whole_tensors
from tether.training.checkpoint import load_shard, save_checkpoint, save_shard
from tether.training.random_state import random_state, set_random_state
from tether.training.run_record import RunRecord
from tether.training.server_progress import next_multiple


class RunCheckpoints:
    """``identity`` names what wrote the checkpoint (method and model names, workers, batch
    size, model_parallel: the launcher checks a resume against it)."""

    def __init__(
        self,
        run_dir: Path,
        world: TorchTransport,
        method: TrainingMethod,
        grid: ProcessGrid | None,
        identity: dict[str, Any],
        every: int | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.world = world
        self.method = method
        self.grid = grid
        self.identity = identity
        # Every rank keeps its own state where replicas differ (and under model parallelism,
        # where each rank holds other slices and their optimizer state); a server's workers
        # restart from the server's state, unless they keep their own (original-easgd).
        self.shards = method.per_rank_state or grid is not None
        # A server's workers save their shards on their own (save_own, where the method's
        # shard_after says), at the points the server checkpoints: the server is serving, so
        # there is no barrier; the server's own state is checkpoint.pt itself.
        self.served = method.server_processes > 0
        # A server's worker without a shard of its own keeps its optimizer and loss scale.
        self.optimizer_only = self.served and not self.shards
        self.is_writer = world.rank == 0
        self.device = method.context.device
        # The random state a resume puts back once the run has started (restore_random_state).
        self.random: Any = None
        # This rank's phase totals, which the trainer adds each step to: from the checkpoint's
        # where the run resumed (restore), so that a resumed run's summary covers the whole run.
        self.totals = PhaseTotals()
        self.every = every  # checkpoint_every (None: no checkpoints)
        # a server's: called as its checkpoint's bytes reach the disk (its workers wait for it)
        self.progress: Callable[[], None] | None = None
        # The first step at which such a worker saves its shard (moved on by a resume).
        self.next_own = next_multiple(0, every) if every else 0
        # The step of the last checkpoint written or resumed from (None: none yet), so that
        # the run's last step is saved once (Trainer._checkpoint_end).
        self.saved_step: int | None = None

    @property
    def takes_part(self) -> bool:
        """Whether this rank has anything to do in a checkpoint."""
        return self.is_writer or self.shards

    def save(self, step: int, record: RunRecord, elapsed: float, flush: Callable[[], None]) -> None:
        """Checkpoint at ``step`` (collective: every rank of a method without a server calls
        it; a server calls it alone). ``flush`` runs before rank 0 writes: the metrics up to
        this step reach the disk first, since a resume will not write them again."""
        # Every rank's phase totals, summed (rank 0 alone writes them); a server's workers keep
        # theirs in their shards (the server is serving: no collective).
        summed = None if self.served else self.totals.all_reduced(self.world.all_reduce)
        self.saved_step = step
        if not self.takes_part:
            return
        own_model = self.method.model.state_dict()
        # checkpoint.pt holds the unsharded model: under model parallelism the slices are
        # gathered (collective: every rank is here, as every rank keeps a shard).
        model_state = whole_tensors(self.method.model, own_model) if self.grid else own_model
        if self.shards and not self.served:
            self.save_own(step)
            self.world.barrier()  # every shard on disk before rank 0's checkpoint names them
        if not self.is_writer:
            return
        flush()
        state = {
            **self.identity,
            "step": step,
            "shards": self.world.world_size if self.shards else 0,
            "optimizer_shards": self.world.world_size if self.optimizer_only else 0,
            "model": model_state,
            "method": self.method.state_dict(),
            # rank 0's: the ranks of a method without shards draw alike (seeded alike, the
            # same shapes), so theirs are the same
            "rng": random_state(self.device),
            **({"worker_totals": True} if summed is None else {"totals": summed.as_tensor()}),
            **record.checkpoint_fields(elapsed),
        }
        save_checkpoint(self.run_dir, state, self.progress)

    def save_own(self, step: int) -> None:
        """This rank's shard: its replica and the method's state (its optimizer's), or for an
        asynchronous worker its optimizer and loss scale alone."""
        own: dict[str, Any] = {"rng": random_state(self.device)}
        if self.optimizer_only:
            scheduler = self.method.scheduler  # its position is the global step's; its kind,
            schedule = scheduler.state_dict() if scheduler is not None else None  # checked
            own["optimizer_only"] = {**self.method.optimizer_state(), "scheduler": schedule}
        else:
            own |= {"model": self.method.model.state_dict(), "method": self.method.state_dict()}
        if self.served:  # a worker reports its totals to the server at its goodbye
            own["totals"] = self.totals.as_tensor()
        save_shard(self.run_dir, self.world.rank, {"step": step, **own})

    def save_own_when_due(self, step: int, last: bool = False) -> None:
        """A server's worker keeping its own state, after a step the method calls consistent
        (``shard_after``): its shard at the first such step at or after each checkpoint
        multiple, which is where the server checkpoints (ServerProgress, at round ends), and at
        its ``last`` step, where the server checkpoints the run's end. An asynchronous worker's
        optimizer and loss scale: after any step, likewise."""
        if not isinstance(self.method, ServerMethod):
            return
        if not (self.method.shard_after(step) or self.optimizer_only):
            return
        if self.every and (step >= self.next_own or last):
            self.save_own(step)
            self.next_own = next_multiple(step, self.every)

    def restore(self, state: dict[str, Any]) -> RunRecord:
        """Load the model and the method's state from a checkpoint (collective: every rank
        calls it); the run's record as it was."""
        step = int(state["step"])
        self.saved_step = step
        if self.every:
            self.next_own = next_multiple(step, self.every)
        shard = None
        complete = False
        if state.get("shards") == self.world.world_size:  # same ranks: each its own state
            server = self.served and self.is_writer  # its state is checkpoint.pt
            shard = None if server else load_shard(self.run_dir, self.world.rank, step)
            # All ranks or none: a rank without its shard makes every rank start from rank 0's.
            every = torch.tensor([1 if server or shard is not None else 0])
            self.world.all_reduce(every, op="min")
            complete = bool(every.item())
            shard = shard if complete else None
            if not complete and self.is_writer and self.grid is None:
                print(
                    f"tether: warning: not every rank's checkpoint shard is at step {step} (a "
                    "crash while they were written?): every rank resumes from checkpoint.pt "
                    "(EASGD workers from the center), so the run will not match an "
                    "uninterrupted one bitwise",
                    file=sys.stderr,
                )
        if shard is None and self.grid is not None:
            raise TetherError(
                "a model-parallel run resumes from every rank's own checkpoint shard, with the "
                "same workers and model_parallel; some are missing or were written by another "
                "grid"
            )
        if shard is not None:
            self.method.model.load_state_dict(shard["model"])
            self.method.load_state_dict({**shard["method"], "own_replica": True})
        else:
            self.method.model.load_state_dict(state["model"])
            self.method.load_state_dict(state["method"])
        own = shard
        if self.optimizer_only and not self.is_writer:
            # after the method's state, which may hold the server's optimizer (Hogwild's
            # methods load it on every rank): the worker's own goes over it
            own = self._restore_optimizer(state)
        self.random = (own or state).get("rng")
        record = RunRecord.resumed(state)
        if not self._restore_totals(state, own, complete):
            record.count_nothing_before()
        return record

    def _restore_totals(self, state: dict[str, Any], own: Any, complete: bool) -> bool:
        """Start this rank's phase totals from the checkpoint's: rank 0 from every rank's sum
        (a method without a server sums the ranks' again for its summary), a server's worker
        from its own shard's (its goodbye reports them). Whether the resumed run's totals count
        the steps before the checkpoint: not from a checkpoint without them (an older one), nor
        where a server's workers start afresh (another worker count)."""
        if not self.served:
            saved = state.get("totals")
            if self.is_writer and isinstance(saved, torch.Tensor):
                self.totals = PhaseTotals.from_tensor(saved)
            return isinstance(saved, torch.Tensor)
        if own is not None and isinstance(own.get("totals"), torch.Tensor):
            self.totals = PhaseTotals.from_tensor(own["totals"])
        kept = complete or state.get("optimizer_shards") == self.world.world_size
        return bool(state.get("worker_totals")) and kept

    def _restore_optimizer(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """An asynchronous worker's optimizer and loss scale, from its own last save, when the
        run has the same ranks as the checkpoint's (else a worker has no saved state, or
        another's: a fresh optimizer, as the method's first start). Returns that save."""
        if state.get("optimizer_shards") != self.world.world_size:
            return None
        shard = load_shard(self.run_dir, self.world.rank, None)
        if shard is None or "optimizer_only" not in shard:
            return None
        try:
            self.method.load_optimizer_state(shard["optimizer_only"])
        except (ValueError, KeyError, RuntimeError) as exc:  # another optimizer than the save's
            print(
                f"tether: warning: rank {self.world.rank} starts a fresh optimizer: its saved "
                f"state does not fit this run's ({exc})",
                file=sys.stderr,
            )
        return shard

    def restore_random_state(self) -> None:
        """Put back the random state of the checkpoint this rank resumed from (its own shard's,
        else rank 0's), once everything that draws at start-up has drawn (after the method's
        start): the rest of the run draws what the uninterrupted run drew after the
        checkpoint (dropout). Nothing without a resume."""
        set_random_state(self.random, self.device)
