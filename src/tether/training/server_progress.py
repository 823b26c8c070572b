"""The trainer's side of a server's loop: the hooks (:class:`~tether.methods.ps_method.ServerHooks`)
a parameter-server or Hogwild method's ``serve`` calls as updates arrive. The server process owns
the run's progress: it shows the global step, evaluates the model it holds every ``eval_every``
global steps, checkpoints, logs the losses its workers report, and says when to stop at the
target. While it evaluates, the workers that wait for its replies are kept waiting
(:class:`WaitingWorkers`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from tether.config import TrainConfig
from tether.observe.metrics import MetricsLog
from tether.observe.progress import progress_bar
from tether.observe.pulse_mark import beat, watch_self
from tether.targets import Target
from tether.training.run_record import RunRecord

SLOW_BATCH = 0.5  # of --timeout: an evaluation batch this long is said to be near it


def evaluation_postfix(target: Target | None, result: dict[str, float]) -> dict[str, str]:
    """The progress bar's evaluation figure: the target's metric, else accuracy, else loss."""
    for name in (target.metric if target else None, "accuracy", "loss"):
        if name is not None and name in result:
            return {"test_acc" if name == "accuracy" else f"test_{name}": f"{result[name]:.3f}"}
    return {}


def next_multiple(step: int, every: int) -> int:
    """The first multiple of ``every`` after ``step``."""
    return (step // every + 1) * every


class WaitingWorkers:
    """The workers waiting for a server's replies, or watching its pulse (Hogwild), while it
    evaluates: before each batch (:meth:`tick`), ``keep_waiting`` (the method's) tells them it
    is busy, so that an evaluation longer than --timeout loses no
    worker. Between
    batches only: a batch that takes near --timeout (a slow dataset, a huge eval batch) could
    still lose them, which is said once."""

    def __init__(self, keep_waiting: Callable[[], None], timeout_s: float) -> None:
        self.keep_waiting = keep_waiting
        self.timeout_s = timeout_s
        self._last = 0.0  # when the evaluation began or the last batch was taken
        self.longest_s = 0.0  # between two of them, in this evaluation
        self._said = False
        self._reassured = time.perf_counter()

    def start(self) -> None:
        self._last, self.longest_s = time.perf_counter(), 0.0

    def tick(self) -> None:
        self._gap()
        self.reassure()

    def reassure(self) -> None:
        """Tell the waiting workers, and the server's supervisor (its pulse: nobody else
        watches it once every worker has finished), that the server is at work."""
        self.keep_waiting()
        beat()
        self._reassured = time.perf_counter()

    def progress(self) -> None:
        """A save's bytes reached the disk: :meth:`reassure`, at most 4 times per --timeout (a
        save that goes on longer than --timeout, progressing, loses no worker; one whose
        writes stop is silent and given up as a hung server)."""
        if time.perf_counter() - self._reassured >= self.timeout_s / 4:
            self.reassure()

    def end(self) -> None:
        self._gap()
        if self.longest_s > SLOW_BATCH * self.timeout_s and not self._said:
            self._said = True
            print(
                f"tether: warning: an evaluation batch took {self.longest_s:.1f} s, near "
                f"--timeout {self.timeout_s:g} s: the server's workers hear from it between "
                "batches only, and one that hears nothing for --timeout gives the server up; "
                "raise --timeout, or evaluate in smaller batches (--set "
                "eval_batch_size=N; tether.fit's eval_batch_size=N)",
                file=sys.stderr,
                flush=True,
            )

    def _gap(self) -> None:
        now = time.perf_counter()
        self.longest_s = max(self.longest_s, now - self._last)
        self._last = now


class ServerProgress:
    """Progress bar, evaluations, checkpoints and worker losses of a server's run.

    ``evaluate(step)`` evaluates and records (the trainer's), ``checkpoint(step)`` saves,
    ``clock()`` is the run's training clock (as the evaluations' ``time_s``), ``parameters()``
    the served model's parameters, flat; ``tensorboard`` is the run's writer or None."""

    def __init__(
        self,
        config: TrainConfig,
        record: RunRecord,
        total_steps: int,
        eval_every: int,
        metrics: MetricsLog,
        tensorboard: Any,
        evaluate: Callable[[int, bool], dict[str, float]],
        checkpoint: Callable[[int], None],
        clock: Callable[[], float],
        parameters: Callable[[], torch.Tensor],
    ) -> None:
        self.config = config
        self.record = record
        self.metrics = metrics
        self.tensorboard = tensorboard
        self._evaluate = evaluate
        self.parameters = parameters  # the served model's, flat
        self.evaluated: torch.Tensor | None = None  # the parameters last evaluated
        self.checkpoint = checkpoint
        self.clock = clock
        self.eval_every = eval_every
        start = record.start_step
        self.bar = progress_bar(total_steps, config.progress, initial=start, desc="serve")
        self.shown_step = start
        self.next_eval = next_multiple(start, eval_every)
        every = config.checkpoint_every
        self.next_checkpoint = next_multiple(start, every) if every else None

    def close(self, rank: int) -> None:
        """The serving is over: its final work begins, which only its supervisor watches (or,
        with none, the server itself: :func:`~tether.observe.pulse_mark.watch_self`)."""
        self.bar.close()
        watch_self(f"server rank {rank}", self.config.timeout_s)

    def evaluate(self, step: int, final: bool = False) -> dict[str, float]:
        """Evaluate the served model at ``step``, remembering the parameters it scored."""
        self.evaluated = self.parameters().clone()
        return self._evaluate(step, final)

    def evaluate_last(self, step: int) -> None:
        """The final evaluation, of the model that is saved. An evaluation at this step may
        already be there, but the weights can have moved since (exchanges that arrive between
        two global steps move them without advancing the count): evaluated again only then,
        replacing that entry and the time to target it may have set (the same numbers twice
        cost a second evaluation and a second line). metrics.jsonl, append-only, then holds
        both lines of the step; the second, the saved model's, is marked ``"final": true``."""
        previous = self.record.history[-1] if self.record.history else None
        again = False
        if previous is not None and previous["step"] == step:
            if self.evaluated is not None and torch.equal(self.evaluated, self.parameters()):
                return
            self.record.history.pop()
            if self.record.time_to_target == previous["time_s"]:
                self.record.time_to_target = None
            again = True
        self.evaluate(step, final=again)

    def on_worker_loss(
        self, rank: int, worker_step: int, loss: float, steps: int, global_step: int | None = None
    ) -> None:
        """A worker's mean training loss over its last ``steps`` local steps, logged at the
        run's global step as of its arrival (``global_step``, where the server says it)."""
        step = self.shown_step if global_step is None else max(self.shown_step, global_step)
        self.metrics.write(
            {
                "step": step,
                "worker": rank,
                "worker_step": worker_step,
                "loss": loss,
                "loss_steps": steps,
                "time_s": self.clock(),
            }
        )
        if self.tensorboard is not None:
            self.tensorboard.add_scalar("train/loss", loss, step)

    def on_progress(self, global_step: int, consistent: bool = True) -> bool:
        """After each update: progress bar, evaluation, checkpoints (at consistent points
        only); True = stop."""
        self.bar.update(max(0, global_step - self.shown_step))
        self.shown_step = max(self.shown_step, global_step)
        if global_step >= self.next_eval:
            result = self.evaluate(global_step)
            target = self.config.target_spec
            self.bar.set_postfix(**evaluation_postfix(target, result), refresh=False)
            # Workers that never wait for the server (Hogwild) can pass several evaluation
            # points during one evaluation: evaluate once, at the newest step.
            self.next_eval = next_multiple(global_step, self.eval_every)
        due = self.next_checkpoint is not None and global_step >= self.next_checkpoint
        if due and consistent:
            self.checkpoint(global_step)
            self.next_checkpoint = next_multiple(global_step, self.config.checkpoint_every)
        return self.config.stop_at_target and self.record.time_to_target is not None
