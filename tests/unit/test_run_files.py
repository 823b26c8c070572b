"""A finished run resumed with nothing left to do keeps its results, and says so; with another
target it says that its summary times its own (it said only "nothing left to do")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.config import TrainConfig
from tether.training.run_files import keeps_finished
from tether.training.run_record import RunRecord


def _finished(run: Path, target: str | None) -> None:
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"steps": 20, "target": target}))
    (run / "model.pt").write_bytes(b"")


@pytest.mark.parametrize(
    ("had", "asked", "said"),
    [
        ("accuracy>=0.5", "accuracy>=0.5", ""),
        ("accuracy>=0.5", None, ""),
        ("accuracy>=0.5", "loss<=0.1", " (its summary times its own target, accuracy>=0.5: a new"),
        (None, "loss<=0.1", " (its summary times its own target, none: a new run in another"),
    ],
)
def test_a_kept_run_says_whose_target_its_summary_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], had: str | None, asked: str | None,
    said: str,
) -> None:  # fmt: skip
    run = tmp_path / "run"
    _finished(run, had)
    config = TrainConfig(out=str(run), resume=True, target=asked)
    assert keeps_finished(config, RunRecord(start_step=20), total_steps=20)
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"tether: {run} finished at step 20: nothing left to do")
    assert line.endswith("kept as they were") if not said else said in line
