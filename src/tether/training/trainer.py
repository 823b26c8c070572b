"""The trainer: everything around a method's step (DESIGN.md "method protocol").

It owns data and sharding, the step loop, evaluation, the metrics log, the progress bar,
checkpoints, fault injection for reliability tests, and the run directory (summary.json,
metrics.jsonl, model.pt, config.toml, and with ``--timeline`` timeline.json). Rank 0 writes;
every rank computes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data import GlobalBatchSampler, load_dataset
from tether.launch.worker import WorkerPlacement
from tether.methods import METHODS, MethodContext, Role, StepTimes
from tether.models import build_model
from tether.observe.files import atomic_write, atomic_write_json, atomic_write_text
from tether.observe.metrics import MetricsLog, PhaseTotals, truncate_metrics
from tether.observe.progress import progress_bar
from tether.observe.step_trace import StepTracer
from tether.observe.timeline import (
    clear_rank_file,
    get_timeline,
    install_timeline,
    merge_timeline,
    uninstall_timeline,
    write_rank_file,
)
from tether.training.checkpoint import load_checkpoint, save_checkpoint
from tether.training.evaluation import EvalResult, evaluate_sharded


def default_eval_every(steps_per_epoch: int) -> int:
    """About four evaluations per epoch: enough points for an accuracy-vs-time curve."""
    return max(1, steps_per_epoch // 4)


class Trainer:
    def __init__(self, config: TrainConfig, placement: WorkerPlacement) -> None:
        assert config.out is not None, "the launcher resolves the run directory"
        self.config = config
        self.device = placement.device
        self.transport = TorchTransport()
        self.is_writer = self.transport.rank == 0
        self.run_dir = Path(config.out)
        self.timeline = get_timeline()
        if config.timeline:
            # Before the method is built, so its first collectives are on the trace too.
            clear_rank_file(self.run_dir, self.transport.rank)
            self.timeline = install_timeline(self.transport.rank)
        self.step_tracer = StepTracer(self.timeline)
        self.timeline_saved = False

        data_dir = Path(config.data_dir) if config.data_dir else None
        self.data = load_dataset(config.dataset, data_dir, config.seed)
        # Same seed on every rank: replicas start identical (methods broadcast rank 0's anyway).
        torch.manual_seed(config.seed)
        model = build_model(config.model, self.data.sample_shape, self.data.num_classes)
        model = model.to(self.device)
        context = MethodContext(config, self.transport, self.device)
        self.method = METHODS.get(config.method)(model, context)

        self.workers = self.method.computing_workers()
        self.sampler = GlobalBatchSampler(
            len(self.data.train_y), config.batch_size * self.workers, config.seed
        )
        spe = self.sampler.steps_per_epoch
        self.total_steps = config.steps if config.steps is not None else config.epochs * spe
        self.eval_every = config.eval_every or default_eval_every(spe)
        self.history: list[dict[str, Any]] = []
        self.totals = PhaseTotals()
        self.start_step = 0
        self.elapsed_before = 0.0  # wall seconds spent before a resume
        self.time_to_target: float | None = None
        self.eval_s = 0.0  # evaluation time, excluded from the history's training time
        # Methods with a server evaluate there; replicated methods evaluate sharded, together.
        self.has_server = self.method.server_processes > 0
        if config.resume:
            self._restore(load_checkpoint(self.run_dir))
        self.method.start(self.start_step)

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> None:
        if self.is_writer:
            atomic_write_text(self.run_dir / "config.toml", self.config.to_toml())
            if self.config.resume:
                # Steps after the checkpoint were lost with the crash; they will be run again.
                truncate_metrics(self.run_dir / "metrics.jsonl", self.start_step)
        self.metrics = MetricsLog(
            self.run_dir / "metrics.jsonl" if self.is_writer else None, append=self.config.resume
        )
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
                    if not self.history or self.history[-1]["step"] != last:
                        self._evaluate(last)
                    if not self.is_writer:
                        self._save_timeline()
                    totals = self.totals.all_reduced(self.transport)
                    eval_model = self.method.eval_model()  # collective: every rank calls it
                    if self.is_writer:
                        self._write_results(last, totals, eval_model, self.method.summary_extra())
            # The other ranks wrote their files before the final synchronisation, so rank 0 can
            # merge here, also under torchrun where no launcher outlives the workers (ranks on
            # other machines: see docs/timeline.md).
            self._save_timeline(merge=self.is_writer)
        finally:
            self.metrics.close()
            # After a failure: a partial trace, which the launcher merges. Failing to write it
            # must not replace the error that ended the run.
            with contextlib.suppress(OSError):
                self._save_timeline()
            uninstall_timeline()

    def _serve(self) -> None:
        """The server's part: serve until the workers are done, evaluating as progress comes."""
        self.bar = progress_bar(
            self.total_steps, self.config.progress, initial=self.start_step, desc="serve"
        )
        self.shown_step = self.start_step
        self.next_eval = (self.start_step // self.eval_every + 1) * self.eval_every
        every = self.config.checkpoint_every
        self.next_checkpoint = (self.start_step // every + 1) * every if every else None
        try:
            result = self.method.serve(self)
        finally:
            self.bar.close()
        last = max(result.global_step, self.start_step)
        if not self.history or self.history[-1]["step"] != last:
            self._evaluate(last)
        extra = {
            **result.extra,
            "lost_workers": [
                {"rank": rank, "reason": reason} for rank, reason in result.lost_workers.items()
            ],
        }
        self._write_results(last, result.totals, self.method.eval_model(), extra)

    def on_progress(self, global_step: int) -> bool:
        """Server hook, after each update: progress bar, evaluation, checkpoints; True = stop."""
        self.bar.update(max(0, global_step - self.shown_step))
        self.shown_step = max(self.shown_step, global_step)
        if global_step >= self.next_eval:
            result = self._evaluate(global_step)
            self.bar.set_postfix(acc=f"{result.accuracy:.3f}", refresh=False)
            # Workers that never wait for the server (Hogwild) can pass several evaluation
            # points during one evaluation: evaluate once, at the newest step.
            self.next_eval = (global_step // self.eval_every + 1) * self.eval_every
        if self.next_checkpoint is not None and global_step >= self.next_checkpoint:
            self._checkpoint(global_step)
            every = self.config.checkpoint_every
            self.next_checkpoint = (global_step // every + 1) * every
        return self.config.stop_at_target and self.time_to_target is not None

    def _step_loop(self) -> int:
        config = self.config
        bar = progress_bar(
            self.total_steps, config.progress and self.is_writer, initial=self.start_step
        )
        step = self.start_step
        widx = self.method.worker_index()
        tracing = self.timeline.enabled
        try:
            while step < self.total_steps:
                begin = time.perf_counter()
                idx = self.sampler.worker_indices(step, widx, self.workers)
                inputs = self.data.train_x[idx].to(self.device, non_blocking=True)
                targets = self.data.train_y[idx].to(self.device, non_blocking=True)
                data_s = time.perf_counter() - begin
                self._maybe_inject_fault(step)

                times = StepTimes()
                called = self.step_tracer.before_step() if tracing else 0.0
                loss = self.method.train_step(inputs, targets, times)
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
                self.totals.add(data_s, times.compute_s, times.comm_s, len(idx))
                step_s = data_s + times.compute_s + times.comm_s
                self.metrics.write(
                    {
                        "step": step,
                        "loss": loss,
                        "data_s": data_s,
                        "compute_s": times.compute_s,
                        "comm_s": times.comm_s,
                    }
                )
                bar.update(1)
                bar.set_postfix(
                    loss=f"{loss:.3f}",
                    samples_s=f"{len(idx) * self.workers / max(step_s, 1e-9):.0f}",
                    refresh=False,
                )
                if self.method.stop_requested:
                    break
                if self.has_server:
                    continue  # the server evaluates and checkpoints
                if step % self.eval_every == 0 or step == self.total_steps:
                    result = self._evaluate(step)
                    bar.set_postfix(loss=f"{loss:.3f}", acc=f"{result.accuracy:.3f}")
                    if config.stop_at_target and self.time_to_target is not None:
                        break
                if config.checkpoint_every and step % config.checkpoint_every == 0:
                    self._checkpoint(step)
        finally:
            bar.close()
        return step

    # -- pieces ----------------------------------------------------------------------------------
    def _elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t0

    def _save_timeline(self, merge: bool = False) -> None:
        """Write this rank's timeline file once (and on rank 0 after a clean run, merge)."""
        if not self.timeline.enabled or self.timeline_saved:
            return
        self.timeline_saved = True
        write_rank_file(self.run_dir, self.transport.rank, self.timeline)
        if merge:
            merge_timeline(self.run_dir)

    def _evaluate(self, step: int) -> EvalResult:
        with self.timeline.span("evaluate", "eval", step=step):
            return self._evaluate_now(step)

    def _evaluate_now(self, step: int) -> EvalResult:
        begin = time.perf_counter()
        model = self.method.eval_model()
        result = evaluate_sharded(
            model,
            self.data.test_x,
            self.data.test_y,
            None if self.has_server else self.transport,
            self.device,
        )
        if self.method.evaluation_pauses_workers:
            self.eval_s += time.perf_counter() - begin
        entry = {
            # Training time: evaluation pauses are not counted, so methods that evaluate on a
            # server and methods that evaluate on every worker are timed alike (Hogwild workers
            # do not pause, so there nothing is subtracted).
            "time_s": self._elapsed() - self.eval_s,
            "step": step,
            "epoch": step / self.sampler.steps_per_epoch,
            "test_accuracy": result.accuracy,
            "test_loss": result.loss,
        }
        self.history.append(entry)
        self.metrics.write({"event": "eval", **entry})
        self.metrics.flush()
        target = self.config.target_accuracy
        if target is not None and self.time_to_target is None and result.accuracy >= target:
            self.time_to_target = entry["time_s"]
        return result

    def _maybe_inject_fault(self, step: int) -> None:
        """Reliability tests: make one rank fail the way a real worker can fail."""
        config = self.config
        if config.fault_rank != self.transport.rank or step != config.fault_step:
            return
        # The wall-clock time of the fault, so a test can measure how fast the run stops.
        (self.run_dir / "injected_fault.txt").write_text(f"{time.time()}\n")
        if config.fault_kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if config.fault_kind == "hang":
            while True:
                time.sleep(1)
        raise RuntimeError(f"injected fault at step {step}")

    def _checkpoint(self, step: int) -> None:
        if not self.is_writer:
            return
        with self.timeline.span("checkpoint", "checkpoint", step=step):
            self._checkpoint_now(step)

    def _checkpoint_now(self, step: int) -> None:
        state = {
            "step": step,
            "model": self.method.model.state_dict(),
            "method": self.method.state_dict(),
            "history": self.history,
            "elapsed_s": self._elapsed(),
            "eval_s": self.eval_s,
            "time_to_target_s": self.time_to_target,
        }
        save_checkpoint(self.run_dir, state)

    def _restore(self, state: dict[str, Any]) -> None:
        self.method.model.load_state_dict(state["model"])
        self.method.load_state_dict(state["method"])
        self.start_step = int(state["step"])
        self.history = list(state["history"])
        self.elapsed_before = float(state["elapsed_s"])
        self.eval_s = float(state.get("eval_s", 0.0))
        self.time_to_target = state["time_to_target_s"]

    def _write_results(
        self, last_step: int, totals: PhaseTotals, eval_model: nn.Module, extra: dict[str, Any]
    ) -> None:
        wall = self._elapsed()
        final = self.history[-1]
        config = self.config
        summary = {
            "method": config.method,
            "workers": self.workers,
            "model": config.model,
            "dataset": config.dataset,
            "seed": config.seed,
            "epochs": last_step / self.sampler.steps_per_epoch,  # completed, fractional
            "steps": last_step,
            "batch_size": config.batch_size,
            "global_batch_size": config.batch_size * self.workers,
            "lr": config.lr,
            "final_test_accuracy": final["test_accuracy"],
            "final_test_loss": final["test_loss"],
            "wall_time_s": wall,
            "target_accuracy": config.target_accuracy,
            "time_to_target_s": self.time_to_target,
            "comm_fraction": totals.comm_fraction,
            "time_split_s": {
                "data": totals.data_s,
                "compute": totals.compute_s,
                "comm": totals.comm_s,
            },
            # Samples processed in this process's lifetime over the wall time they took.
            "samples_per_s": totals.samples / max(wall - self.elapsed_before, 1e-9),
            "evaluation_s": self.eval_s,
            **extra,
            "history": self.history,
        }
        atomic_write(self.run_dir / "model.pt", lambda h: torch.save(eval_model.state_dict(), h))
        atomic_write_json(self.run_dir / "summary.json", summary)
