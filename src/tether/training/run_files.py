"""The run directory's files as a run starts: ``config.toml`` (the settings it runs with),
``metrics.jsonl`` (on a resume, cut back to the checkpoint's step: the steps after it are run
again) and TensorBoard's event files; or, for a finished run resumed with nothing left to do,
none of them touched: its results stand as they were."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.config import TrainConfig
from tether.observe.files import atomic_write_text
from tether.observe.metrics import MetricsLog, truncate_metrics
from tether.observe.tensorboard import open_tensorboard
from tether.training.run_record import RunRecord


@dataclass
class RunFiles:
    """What a rank writes during the run (rank 0's open files; the others' write nothing)."""

    metrics: MetricsLog
    tensorboard: Any  # TensorBoard's SummaryWriter, or None
    kept: bool  # a finished run resumed: nothing is written, its results stay


def open_run_files(
    config: TrainConfig, record: RunRecord, total_steps: int, is_writer: bool
) -> RunFiles:
    """Open the run's files on rank 0 (``is_writer``); on other ranks, a log that writes
    nothing."""
    run_dir = Path(str(config.out))
    kept = is_writer and keeps_finished(config, record, total_steps)
    tensorboard = None
    if is_writer and not kept:
        atomic_write_text(run_dir / "config.toml", config.to_toml())
        if config.resume:
            # Steps after the checkpoint were lost with the crash; they will be run again.
            truncate_metrics(run_dir / "metrics.jsonl", record.start_step)
        if config.tensorboard:
            tensorboard = open_tensorboard(run_dir / "tensorboard", record.start_step)
    metrics = MetricsLog(run_dir / "metrics.jsonl" if is_writer else None, append=config.resume)
    return RunFiles(metrics, tensorboard, kept)


def keeps_finished(config: TrainConfig, record: RunRecord, total_steps: int) -> bool:
    """Whether a resumed run leaves the results in its directory as they are: it had nothing
    left to do (its checkpoint is at its last step, or at the target it stopped at) and the run
    finished there, with a summary of that step that does not say it failed. Rewritten, the
    summary would time the resume alone (nothing) and the model would be saved again; a run
    that crashed before it wrote them writes them as usual. Says so on stderr."""
    step, run_dir = record.start_step, Path(str(config.out))
    if not config.resume or not record.done(total_steps, config.stop_at_target):
        return False
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    finished = (
        isinstance(summary, dict)
        and summary.get("steps") == step
        and summary.get("status") != "failed"
        and (run_dir / "model.pt").exists()
    )
    if finished:
        timed, asked = summary.get("target"), config.target_spec
        other = (
            f" (its summary times its own target, {timed or 'none'}: a new run in another "
            f"directory times {asked})"
            if asked is not None and str(asked) != timed
            else ""
        )
        print(
            f"tether: {run_dir} finished at step {step}: nothing left to do, its results are "
            f"kept as they were{other}",
            file=sys.stderr,
        )
    return finished
