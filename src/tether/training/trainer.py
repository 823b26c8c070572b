"""The trainer: everything around a method's step, built from objects.

Given a config, a :class:`~tether.training.task.Task` (model, data, loss, optimizer and schedule
factories, metrics) and the worker's runtime (transport, device, placement), it owns sharding, the
step loop, evaluation, logging, checkpoints, fault injection for reliability tests, and the run
directory (summary.json, metrics.jsonl, model.pt, config.toml, optionally timeline.json and
TensorBoard events). Rank 0 writes; every rank computes.

The step loop is the one a user writes for one process (``zero_grad``, forward, ``backward``,
``step``) on the method's :class:`~tether.training.method_optimizer.MethodOptimizer`, the same
object ``tether.init``'s ``wrap`` hands a user's own loop.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data.sharding import GlobalBatchSampler
from tether.errors import WorkerFailure
from tether.methods import Placement, Role, TrainingMethod
from tether.methods.ps_method import ServerMethod
from tether.observe.joined import mark_joined
from tether.observe.metrics import PhaseTotals
from tether.observe.progress import progress_bar
from tether.observe.pulse_mark import start_pulse, stop_watching
from tether.observe.step_trace import StepTracer
from tether.observe.timeline import (
    clear_rank_file,
    get_timeline,
    install_timeline,
    merge_timeline,
    uninstall_timeline,
    write_rank_file,
)
from tether.parallel import full_state_dict
from tether.training.batches import TrainBatches, batch_size_of
from tether.training.build import build_method, computing_workers, planned_steps, steps_per_epoch
from tether.training.checkpoint import load_checkpoint
from tether.training.evaluation import eval_interval
from tether.training.faults import maybe_inject_fault, send_fault
from tether.training.method_optimizer import MethodOptimizer
from tether.training.model_parallel import build_grid
from tether.training.objective import Evaluated, Objective
from tether.training.results import run_summary, write_results
from tether.training.run_checkpoints import RunCheckpoints
from tether.training.run_files import open_run_files
from tether.training.run_log import StepLog, evaluation_entry, record_evaluation
from tether.training.run_record import RunRecord
from tether.training.scoring import Scoring
from tether.training.server_progress import ServerProgress, WaitingWorkers
from tether.training.task import Task


@dataclass(frozen=True)
class WorkerRuntime:
    """Where this worker runs: its transport (the process group), device and placement."""

    transport: TorchTransport
    device: torch.device
    placement: Placement = field(default_factory=Placement)


class Trainer:
    def __init__(self, config: TrainConfig, task: Task, runtime: WorkerRuntime) -> None:
        assert config.out is not None, "the launcher resolves the run directory"
        self.config = config
        self.task = task
        self.device = runtime.device
        # The world's transport names the process (files, faults, shards); the data-parallel
        # group's (the world's, but under model parallelism) shards the data, evaluates and
        # carries the method.
        self.world = runtime.transport
        self.rank = self.world.rank
        self.grid = build_grid(self.world, config)
        self.transport = self.grid.data if self.grid is not None else self.world
        self.is_writer = self.rank == 0
        self.run_dir = Path(config.out)
        self.timeline = get_timeline()
        if config.timeline:  # before the method is built: its first collectives are traced
            self.timeline = install_timeline(self.rank)
        self.step_tracer = StepTracer(self.timeline)

        self.workers = computing_workers(config, self.transport.world_size)
        samples = len(task.train_data)  # type: ignore[arg-type]
        self.sampler = GlobalBatchSampler(samples, config.batch_size * self.workers, config.seed)
        spe = self.steps_per_epoch = steps_per_epoch(config, samples, self.workers)
        self.total_steps = planned_steps(config, spe)
        self.method: TrainingMethod = build_method(
            config,
            task,
            self.transport,
            self.device,
            runtime.placement,
            self.total_steps,
            spe,
            self.grid,
        )
        hang = send_fault(config, self.rank, self.run_dir)  # a hang after a worker's send
        if hang is not None and isinstance(self.method, ServerMethod) and not self.method.is_server:
            self.method.on_sent = hang
        self.optimizer = MethodOptimizer(self.method, config.accumulate)
        self.objective = Objective(task.loss)
        self.scoring = Scoring(
            config, task, self.method, self.transport, self.device, self.objective, self._forward
        )
        self.has_server = self.scoring.on_server  # the server evaluates and checkpoints
        self.target = config.target_spec
        self.batches = TrainBatches(
            task.train_data,
            self.sampler,
            self.method.worker_index(),
            self.workers,
            self.device,
            task.collate_fn,
            task.loader_options,
        )
        self.eval_every = eval_interval(
            config.eval_every, spe, self.total_steps, self.scoring.has_data
        )
        self.served_s: float | None = None  # the training clock once a server's workers are done
        identity = {
            "method_name": config.method,
            "model_name": task.model_name,
            "workers": self.workers * config.model_parallel,
            "batch_size": config.batch_size,
            "model_parallel": config.model_parallel,
        }
        self.checkpoints = RunCheckpoints(
            self.run_dir, self.world, self.method, self.grid, identity, config.checkpoint_every
        )
        self.record = RunRecord()
        if config.resume:
            self.record = self.checkpoints.restore(load_checkpoint(self.run_dir))
            self.record.retarget(config.target_spec)
        done = self.record.done(self.total_steps, config.stop_at_target)  # resumed: no step left
        self.end_step = self.record.start_step if done else self.total_steps
        if config.timeline and not done:  # (done: the run's trace stands, as its results)
            clear_rank_file(self.run_dir, self.rank)
        self.timeline_saved = done
        self.totals = self.checkpoints.totals  # this rank's so far (a resumed run's included)
        self.scoring.fix_metrics()
        # before the start: a server's TensorBoard writer takes a while to open, which its
        # workers, past their start, counted as communication (kept: a finished run's stand)
        files = open_run_files(self.config, self.record, self.total_steps, self.is_writer)
        self.metrics, self.tensorboard, self.kept = files.metrics, files.tensorboard, files.kept
        self.method.start(self.record.start_step)
        mark_joined()  # a worker lost from now on is one the run can carry on without
        self.checkpoints.restore_random_state()  # after all that draws at start-up

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> None:
        self.t0 = time.perf_counter()
        try:
            with self.step_tracer.timing_updates():
                if self.method.role() is Role.SERVER:
                    self._serve()
                elif self.has_server:
                    self._step_loop()
                    self._save_timeline()  # before the final synchronisation: see below
                    self.method.finish(self.totals)  # reports this worker's timings to the server
                else:
                    last = self._step_loop()
                    self.method.finish(None)
                    if not self.record.history or self.record.history[-1]["step"] != last:
                        self._evaluate(last)
                    if not self.is_writer:
                        self._save_timeline()
                    # every computing rank's (summary.json's workers counts them all)
                    group = self.config.model_parallel
                    totals = self.totals.all_reduced(self.world.all_reduce, group)
                    model = self.method.eval_model()  # collective: every rank calls it
                    # (under model parallelism the unsharded model's: collective too)
                    split = self.grid is not None
                    model_state = full_state_dict(model) if split else model.state_dict()
                    if self.is_writer:
                        self._write_results(last, totals, model_state, self.method.summary_extra())
            # The other ranks wrote their files before the final synchronisation, so rank 0 can
            # merge here, also under torchrun where no launcher outlives the workers (ranks on
            # other machines: see docs/timeline.md).
            self._save_timeline(merge=self.is_writer)
        finally:
            stop_watching()  # a server's watch on itself (no supervisor): also after a failure
            self.metrics.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
            # After a failure: a partial trace, which the launcher merges. Failing to write it
            # must not replace the error that ended the run.
            with contextlib.suppress(OSError):
                self._save_timeline()
            uninstall_timeline()

    def _serve(self) -> None:
        """The server's part: serve until the workers are done, evaluating as progress comes."""
        method = self.method
        start_pulse(self.config.timeout_s)  # for its supervisor, once the workers have finished
        if isinstance(method, ServerMethod):
            self.scoring.waiting = WaitingWorkers(method.keep_waiting, self.config.timeout_s)
            self.checkpoints.progress = self.scoring.waiting.progress  # a long save's bytes
        hooks = ServerProgress(
            self.config,
            self.record,
            self.total_steps,
            self.eval_every,
            self.metrics,
            self.tensorboard,
            self._evaluate,
            self._checkpoint,
            self._training_clock,
            # buffers left out: an evaluation recomputes a center's batch-norm statistics
            lambda: torch.cat(
                [p.detach().reshape(-1) for p in self.method.eval_model().parameters()]
            ),
        )
        try:
            result = self.method.serve(hooks)
        finally:  # its serving over: the server beats for its supervisor, or watches itself
            hooks.close(self.rank)
        self.served_s = self._training_clock()
        last = max(result.global_step, self.record.start_step)
        stopped_at_target = self.config.stop_at_target and self.record.time_to_target is not None
        if not self.kept:
            hooks.evaluate_last(last)
        model_state = self.method.eval_model().state_dict()
        failure: WorkerFailure | None = None
        try:
            result.check_complete(self.total_steps, stopped_at_target)
        except WorkerFailure as exc:
            failure = exc
        # A run that did not do its work still writes what it has (the model as far as it got),
        # marked failed, so that nothing reads it as a finished run
        extra = result.summary_extra()
        if failure is not None:
            extra = {**extra, "status": "failed", "error": str(failure)}
        ends = failure is None and (last >= self.total_steps or stopped_at_target)
        if isinstance(method, ServerMethod) and method.per_rank_state:  # original-easgd:
            # where its workers' shards are, a round's end of the whole run
            ends = ends and last >= self.total_steps and method.shard_after(last)
        if ends:
            self._checkpoint_end(last)  # its workers saved theirs at their last step
        with self.scoring.busy():
            self._write_results(last, result.totals, model_state, extra)
        stop_watching()  # written: the timeline's merge (no beats, minutes for a long trace) is not
        if failure is not None:
            raise failure

    def _forward(self, model: nn.Module, batch: Any) -> Evaluated:
        """The user's loss on one batch, in the run's precision."""
        with self.method.precision.autocast(self.device):
            return self.objective(model, batch)

    def _backward(self, batch: Any) -> torch.Tensor:
        """Forward and backward on one batch: the closure the method's step runs, which clears
        the gradients first as a torch closure does (during an accumulation that does
        nothing)."""
        self.optimizer.zero_grad()
        result = self._forward(self.method.model, batch)
        self.method.backward_loss(result.loss)
        return result.loss.detach()

    def _step_loop(self) -> int:
        config = self.config
        bar = progress_bar(
            self.total_steps, config.progress and self.is_writer, initial=self.record.start_step
        )
        log = StepLog(self.metrics, self.tensorboard, bar, self.workers, self.target)
        k = config.accumulate
        step = self.record.start_step
        batches = self.batches.iterate(step * k, self.total_steps * k)
        tracing = self.timeline.enabled
        try:
            while step < self.end_step:
                begin = time.perf_counter()
                batch = next(batches)
                data_s = time.perf_counter() - begin
                maybe_inject_fault(config, self.rank, step, self.run_dir)
                called = self.step_tracer.before_step() if tracing else time.perf_counter()
                losses, samples, later_data_s = [], 0, 0.0
                for micro in range(k):
                    if micro:  # the next batch of the accumulation, counted as data time
                        fetch = time.perf_counter()
                        batch = next(batches)
                        later_data_s += time.perf_counter() - fetch
                    samples += batch_size_of(batch)
                    loss = self.optimizer.step(partial(self._backward, batch))
                    losses.append(loss)
                times = self.optimizer.last_times
                # The step's time that was neither waiting for communication nor loading data.
                elapsed = self.method.clock() - called
                times.compute_s = max(0.0, elapsed - times.comm_s - times.paused_s - later_data_s)
                data_s += later_data_s
                step += 1
                if tracing:
                    self.step_tracer.step(
                        step,
                        begin,
                        data_s,
                        called,
                        times.compute_s,
                        times.comm_s,
                        times.comm_spans,
                    )
                self.totals.add(data_s, times.compute_s, times.comm_s, samples)
                log.step(step, losses, data_s, times, samples, self._training_clock())
                if self.method.stop_requested:
                    break
                if self.has_server:  # the server evaluates and checkpoints
                    self.checkpoints.save_own_when_due(step)
                    continue
                if step % self.eval_every == 0 or step == self.total_steps:
                    log.evaluated(self._evaluate(step))
                    if config.stop_at_target and self.record.time_to_target is not None:
                        break
                if config.checkpoint_every and step % config.checkpoint_every == 0:
                    self._checkpoint(step)
        finally:
            bar.close()
        # its last step, the run's length or its target's (see training.run_checkpoints)
        if not self.has_server:
            self._checkpoint_end(step)
        elif step > self.record.start_step:  # a shard only where the server checkpoints
            last = step >= self.total_steps or not self.checkpoints.shards
            self.checkpoints.save_own_when_due(step, last=last)
        return step

    def _elapsed(self) -> float:
        return self.record.elapsed_before + time.perf_counter() - self.t0

    def _training_clock(self) -> float:
        """Training time: the run's clock without the evaluation pauses (``time_s`` in
        metrics.jsonl, samples_per_s's time); a server's stops once its workers are done."""
        return self.served_s if self.served_s is not None else self._elapsed() - self.record.eval_s

    def _save_timeline(self, merge: bool = False) -> None:
        """Write this rank's timeline file once (and on rank 0 after a clean run, merge)."""
        if not self.timeline.enabled or self.timeline_saved:
            return
        self.timeline_saved = True
        write_rank_file(self.run_dir, self.rank, self.timeline)
        if merge:
            merge_timeline(self.run_dir)

    def _evaluate(self, step: int, final: bool = False) -> dict[str, float]:
        with self.timeline.span("evaluate", "eval", step=step):
            return self._evaluate_now(step, final)

    def _evaluate_now(self, step: int, final: bool) -> dict[str, float]:
        begin = time.perf_counter()
        result = dict(self.scoring.score())
        if self.method.evaluation_pauses_workers:
            self.record.eval_s += time.perf_counter() - begin
        clock = self._training_clock()
        entry = evaluation_entry(clock, step, self.steps_per_epoch, result, final)
        record_evaluation(self.record, self.metrics, self.tensorboard, self.target, entry, result)
        return result

    def _checkpoint_end(self, step: int) -> None:
        """The run's end (its length or its target), unless it saved or resumed there."""
        if self.checkpoints.saved_step != step:
            self._checkpoint(step)

    def _checkpoint(self, step: int) -> None:
        if not self.config.checkpoint_every:
            return
        with self.timeline.span("checkpoint", "checkpoint", step=step), self.scoring.busy():
            self.checkpoints.save(step, self.record, self._elapsed(), self.metrics.flush)

    def _write_results(
        self,
        last_step: int,
        totals: PhaseTotals,
        model_state: dict[str, Any],
        extra: dict[str, Any],
    ) -> None:
        if self.kept:
            return
        summary = run_summary(
            self.config,
            self.task,
            self.method,
            self.record,
            last_step,
            totals,
            (self._elapsed(), self._training_clock()),
            self.workers,
            self.steps_per_epoch,
            extra,
        )
        write_results(self.run_dir, summary, model_state, self.checkpoints.progress)
