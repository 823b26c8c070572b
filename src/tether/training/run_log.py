"""What a run logs as it trains: each worker step's line and each evaluation's entry.

A step: its metrics.jsonl line (mean loss over the accumulated micro-batches, data, compute and
exposed communication seconds, the training clock at its end), TensorBoard's ``train/loss``, and
the progress bar (loss, samples per second over all workers). An evaluation: its entry in the
run's history and in metrics.jsonl (flushed: a crash loses no evaluation), TensorBoard's
``test/*``, and the time the target was first reached. The server's progress (global steps, its
workers' reported losses) is :mod:`tether.training.server_progress`.
"""

from __future__ import annotations

from typing import Any

import torch

from tether.methods import StepTimes
from tether.observe.metrics import MetricsLog
from tether.targets import Target
from tether.training.run_record import RunRecord
from tether.training.server_progress import evaluation_postfix


class StepLog:
    """A worker's per-step reports; ``tensorboard`` is the run's writer or None, ``bar`` the
    step loop's progress bar."""

    def __init__(
        self, metrics: MetricsLog, tensorboard: Any, bar: Any, workers: int, target: Target | None
    ) -> None:
        self.metrics = metrics
        self.tensorboard = tensorboard
        self.bar = bar
        self.workers = workers
        self.target = target
        self.last_loss = 0.0

    def step(
        self,
        step: int,
        losses: list[torch.Tensor | None],
        data_s: float,
        times: StepTimes,
        samples: int,
        time_s: float,
    ) -> None:
        """Report step ``step`` (1-based, done); ``time_s`` is the training clock at its end."""
        loss = sum(float(v) for v in losses if v is not None) / max(len(losses), 1)
        self.last_loss = loss
        self.metrics.write(
            {
                "step": step,
                "loss": loss,
                "data_s": data_s,
                "compute_s": times.compute_s,
                "comm_s": times.comm_s,
                "time_s": time_s,
            }
        )
        if self.tensorboard is not None:
            self.tensorboard.add_scalar("train/loss", loss, step)
        step_s = data_s + times.compute_s + times.comm_s
        self.bar.update(1)
        self.bar.set_postfix(
            loss=f"{loss:.3f}",
            samples_s=f"{samples * self.workers / max(step_s, 1e-9):.0f}",
            refresh=False,
        )

    def evaluated(self, result: dict[str, float]) -> None:
        """Show an evaluation's figure beside the last step's loss."""
        postfix = evaluation_postfix(self.target, result)
        self.bar.set_postfix(loss=f"{self.last_loss:.3f}", **postfix)


def evaluation_entry(
    time_s: float, step: int, steps_per_epoch: int, result: dict[str, float], final: bool
) -> dict[str, Any]:
    """An evaluation as the history and metrics.jsonl keep it: ``time_s`` is training time
    (evaluation pauses are not counted, so methods that evaluate on a server and methods that
    evaluate on every worker are timed alike; Hogwild workers do not pause, so there nothing is
    subtracted); ``final`` marks a second evaluation of its step."""
    return {
        "time_s": time_s,
        "step": step,
        "epoch": step / steps_per_epoch,
        **{f"test_{name}": value for name, value in result.items()},
        **({"final": True} if final else {}),
    }


def record_evaluation(
    record: RunRecord,
    metrics: MetricsLog,
    tensorboard: Any,
    target: Target | None,
    entry: dict[str, float],
    result: dict[str, float],
) -> None:
    """Keep one evaluation: ``entry`` (time_s, step, epoch and the ``test_*`` values) goes to the
    history and metrics.jsonl, ``result``'s values to TensorBoard, and the entry's time becomes
    the time to target if it is the first to reach it."""
    record.history.append(entry)
    metrics.write({"event": "eval", **entry})
    metrics.flush()
    if tensorboard is not None:
        for name, value in result.items():
            tensorboard.add_scalar(f"test/{name}", value, int(entry["step"]))
    if (
        target is not None
        and record.time_to_target is None
        and target.metric in result
        and target.reached(result[target.metric])
    ):
        record.time_to_target = entry["time_s"]
