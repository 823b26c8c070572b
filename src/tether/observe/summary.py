"""summary.json (the run-directory contract, README.md "The run directory") and the short human summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tether.words import counted

REQUIRED_FIELDS = (
    "method",
    "workers",
    "model",
    "dataset",
    "seed",
    "epochs",
    "steps",
    "global_batch_size",
    "final_test_accuracy",
    "final_test_loss",
    "wall_time_s",
    "training_time_s",
    "time_to_target_s",
    "comm_fraction",
    "samples_per_s",
    "history",
)
HISTORY_FIELDS = ("time_s", "step", "epoch", "test_accuracy", "test_loss")


def missing_fields(summary: dict[str, Any]) -> list[str]:
    """Names of contract fields absent from ``summary`` (and from any history entry)."""
    missing = [name for name in REQUIRED_FIELDS if name not in summary]
    for entry in summary.get("history", []):
        missing += [f"history.{name}" for name in HISTORY_FIELDS if name not in entry]
    return sorted(set(missing))


def lost_worker_text(entry: dict[str, Any]) -> str:
    """``rank 2 at 14:03:52 (killed by SIGKILL)``; the time is the local clock's."""
    when = str(entry.get("lost_at", ""))[11:19]  # HH:MM:SS of an ISO time
    return f"rank {entry.get('rank')}{f' at {when}' if when else ''} ({entry.get('reason', '?')})"


def _metrics_line(summary: dict[str, Any]) -> str:
    """``test accuracy 82.54%  test loss 0.4786`` (and any other metric), or that there was
    no evaluation."""
    metrics = dict(summary.get("final_metrics") or {})
    if not metrics:
        accuracy, loss = summary.get("final_test_accuracy"), summary.get("final_test_loss")
        metrics = {k: v for k, v in (("accuracy", accuracy), ("loss", loss)) if v is not None}
    if not metrics:
        return "  no evaluation (no evaluation data)"
    parts = []
    if "accuracy" in metrics:
        parts.append(f"test accuracy {_shown(metrics.pop('accuracy'), '.2%')}")
    if "loss" in metrics:
        parts.append(f"test loss {_shown(metrics.pop('loss'), '.4f')}")
    parts += [f"{name} {_shown(value, '.4g')}" for name, value in metrics.items()]
    return "  " + "  ".join(parts)


def _shown(value: float | None, spec: str) -> str:
    """A metric as the summary shows it; None is one that was not a number (a diverged run's
    loss, written as JSON's null)."""
    return "not a number (diverged)" if value is None else format(value, spec)


def run_summary_text(run_dir: Path) -> str:
    """:func:`human_summary` of the run in ``run_dir``, read from its summary.json."""
    return human_summary(json.loads((run_dir / "summary.json").read_text()), run_dir)


def human_summary(summary: dict[str, Any], run_dir: Path) -> str:
    target = summary.get("target")
    if target is None and summary.get("target_accuracy") is not None:
        target = f"accuracy>={summary['target_accuracy']:.2%}"
    reached = summary.get("time_to_target_s")
    grid = int(summary.get("model_parallel") or 1)
    groups = f" (model groups of {grid})" if grid > 1 else ""
    lines = [
        f"{summary['method']} on {counted(summary['workers'], 'worker')}{groups}, {summary['model']} / "
        f"{summary['dataset']}: {_steps(summary)} steps ({summary['epochs']:.2f} epochs)",
        _metrics_line(summary),
        _time_line(summary),
        f"  communication share {summary['comm_fraction']:.1%} of worker time (not hidden)",
    ]
    if target is not None:
        when = f"after {reached:.1f} s" if reached is not None else "not reached"
        lines.append(f"  target {target}: {when}")
    skipped = summary.get("fp16_skipped_steps")
    if skipped and skipped >= summary["steps"]:  # a scale above fp16's range said nothing
        lines.append(
            f"  fp16: every step ({skipped}) overflowed and was skipped: nothing trained; start "
            "from a lower loss_scale, or use bf16"
        )
    elif skipped:
        lines.append(
            f"  fp16: {skipped} of {summary['steps']} steps skipped for an overflow (the loss "
            "scale finding its level)"
        )
    lost = summary.get("lost_workers") or []
    if lost:
        lines.append(
            "  lost workers (the run carried on without them): "
            + ", ".join(lost_worker_text(entry) for entry in lost)
        )
    earlier = summary.get("lost_before_resume") or []
    if earlier:
        lines.append(
            "  lost before the resume: " + ", ".join(lost_worker_text(entry) for entry in earlier)
        )
    lines.append(f"  run directory: {run_dir}")
    return "\n".join(lines)


def _time_line(summary: dict[str, Any]) -> str:
    """The wall time, and the training time the rate is over (without the evaluations)."""
    training = summary.get("training_time_s")  # (a summary of an earlier version has none)
    trained = f", training {training:.1f} s" if training is not None else ""
    rate = f"{summary['samples_per_s']:.0f} samples/s"
    return f"  wall time {summary['wall_time_s']:.1f} s{trained}  ({rate})"


def _steps(summary: dict[str, Any]) -> str:
    """``40``, or ``22 of 40`` for a run that ended short of its length."""
    planned = summary.get("planned_steps")  # (a summary of an earlier version has none)
    short = planned is not None and summary["steps"] < planned
    return f"{summary['steps']} of {planned}" if short else str(summary["steps"])
