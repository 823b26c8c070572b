"""metrics.jsonl: every line survives its writer being killed; on resume, what the resumed run
will write again is dropped first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tether.observe.files import atomic_write_json
from tether.observe.metrics import MetricsLog, truncate_metrics
from tether.observe.summary import _metrics_line


def test_a_resume_drops_what_came_after_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    records = [
        {"step": 9, "loss": 1.0, "time_s": 0.9},  # a replicated run's step lines
        {"step": 10, "loss": 0.9, "time_s": 1.0},  # the checkpoint's step: written before it
        {"step": 11, "loss": 0.8, "time_s": 1.1},
        {"event": "eval", "step": 10, "time_s": 1.05},
        {"step": 9, "worker": 1, "loss": 1.0, "loss_steps": 4, "time_s": 0.95},
        # a server logs a report at the global step as of its arrival: one logged at the
        # checkpoint's step arrived after the checkpoint, and its steps are trained again
        {"step": 10, "worker": 2, "loss": 0.9, "loss_steps": 4, "time_s": 1.2},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    truncate_metrics(path, 10)
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert kept == [records[0], records[1], records[3], records[4]]
    truncate_metrics(tmp_path / "none.jsonl", 10)  # no file yet: nothing to do
    assert not (tmp_path / "none.jsonl").exists()


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from tether.observe.metrics import MetricsLog
log = MetricsLog(Path(sys.argv[1]))
for step in range(3):
    log.write({"step": step, "loss": 1.0})
os.kill(os.getpid(), signal.SIGKILL)  # no flush, no close: as a rank killed mid-run
"""


def test_a_killed_writer_loses_no_line(tmp_path: Path) -> None:
    """The step lines were block-buffered until the next evaluation: rank 0 killed between two
    evaluations took up to a quarter epoch of them with it."""
    path = tmp_path / "metrics.jsonl"
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], timeout=60)
    assert done.returncode == -9
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]


def test_a_diverged_loss_is_said_once_and_written_as_json_null(tmp_path: Path, capsys) -> None:
    """A NaN loss went by without a word, and Python's bare NaN in metrics.jsonl and
    summary.json is not JSON (JavaScript's JSON.parse and jq refuse it)."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1, "loss": 0.5})
    log.write({"step": 2, "loss": float("nan")})
    log.write({"step": 3, "loss": float("inf")})
    log.close()
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "tether: warning: the training loss is nan at step 2: the run diverged; lower the "
        "learning rate, or clip the gradients (--clip-grad-norm; clip_grad_norm in Python)"
    ]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in lines] == [0.5, None, None]
    summary = {"method": "sync-sgd", "final_metrics": {"accuracy": 0.1, "loss": float("nan")}}
    atomic_write_json(tmp_path / "summary.json", summary)
    text = (tmp_path / "summary.json").read_text()
    assert "NaN" not in text and json.loads(text)["final_metrics"]["loss"] is None
    shown = _metrics_line(json.loads(text))
    assert shown == "  test accuracy 10.00%  test loss not a number (diverged)"
