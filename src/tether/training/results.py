"""A finished run's results: ``summary.json`` (what ran, how it did, where the time went) and
``model.pt`` (the evaluated model's state_dict: the center for EASGD, the unsharded model under
model parallelism), both written atomically by rank 0."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tether.config import TrainConfig
from tether.methods import Role, TrainingMethod
from tether.observe.files import atomic_write, atomic_write_json
from tether.observe.metrics import PhaseTotals
from tether.optim.schedules import schedule_name
from tether.training.build import initial_lr, planned_steps, run_settings
from tether.training.run_record import RunRecord
from tether.training.task import Task


def run_summary(
    config: TrainConfig,
    task: Task,
    method: TrainingMethod,
    record: RunRecord,
    last_step: int,
    totals: PhaseTotals,
    clocks: tuple[float, float],
    data_workers: int,
    steps_per_epoch: int,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """summary.json's dict; ``clocks``: the run's wall time and its training time (without the
    evaluation pauses); ``extra`` adds the method's own entries (rounds, lost workers)."""
    wall, training = clocks
    final = record.history[-1] if record.history else {}
    final_metrics = {
        key.removeprefix("test_"): value for key, value in final.items() if key.startswith("test_")
    }
    target = config.target_spec
    return {
        "method": config.method,
        "workers": data_workers * config.model_parallel,  # every model group's ranks
        "model_parallel": config.model_parallel,
        "model": task.model_name,
        "dataset": task.data_name,
        "seed": config.seed,
        "epochs": last_step / steps_per_epoch,  # completed, fractional
        "steps": last_step,
        # the run's length as set (a run that lost workers, or stopped at its target, is short)
        "planned_steps": planned_steps(config, steps_per_epoch),
        "batch_size": config.batch_size,
        "accumulate": config.accumulate,
        "global_batch_size": config.batch_size * data_workers * config.accumulate,
        "lr": initial_lr(method.optimizer, config.scaled_lr),  # as the optimizer took it
        # what it used (compare's rows)
        "settings": run_settings(config, method.optimizer, method.scheduler),
        "optimizer": type(method.optimizer).__name__,
        "lr_schedule": schedule_name(method.scheduler),
        # fp16: the steps the writing rank skipped for an overflow (every rank's count in the
        # synchronous methods, which skip alike; None on a server, which scales no loss)
        "fp16_skipped_steps": (
            method.scaler.skipped
            if method.scaler is not None and method.role() is not Role.SERVER
            else None
        ),
        "final_test_accuracy": final_metrics.get("accuracy"),
        "final_test_loss": final_metrics.get("loss"),
        "final_metrics": final_metrics,
        "wall_time_s": wall,
        "training_time_s": training,
        "target": str(target) if target else None,
        "target_accuracy": config.target_accuracy,
        "time_to_target_s": record.time_to_target,
        "comm_fraction": totals.comm_fraction,
        "time_split_s": {"data": totals.data_s, "compute": totals.compute_s, "comm": totals.comm_s},
        # Samples processed over the training time they took (evaluations left out, which
        # would make the rate depend on how often a run evaluates): the whole run's, where a
        # resumed run's totals count those before the checkpoint (training.run_checkpoints)
        "samples_per_s": totals.samples / max(training - record.uncounted_s, 1e-9),
        "evaluation_s": record.eval_s,
        # rank 0's node: workers, threads and cores of each (tether.launch.partition)
        "partition": method.context.placement.partition,
        **extra,
        "history": record.history,
    }


def write_results(
    run_dir: Path,
    summary: dict[str, Any],
    model_state: dict[str, Any],
    progress: Callable[[], None] | None = None,
) -> None:
    """model.pt and summary.json; ``progress`` as in :func:`tether.training.checkpoint.save_checkpoint`."""
    atomic_write(run_dir / "model.pt", lambda handle: torch.save(model_state, handle), progress)
    atomic_write_json(run_dir / "summary.json", summary)
