"""EASGD-family runs end to end: the center is evaluated and saved, resume restores it, and a
run can resume with a different number of workers (every worker restarts from the center).

sync-easgd's center evaluation, and a resume with nothing left to do, are checked through the
trainer on one spawned group (tests/distributed/test_shard_resume.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import requires_fashion_mnist, run_cli

pytestmark = requires_fashion_mnist
COMMON = [
    "--batch-size",
    "32",
    "--no-progress",
    "--timeout",
    "20",
    "--eval-every",
    "10",
    "--lr",
    "0.2",
]


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


# Slow (two launches, about 33 s): the fast set checks that an asynchronous run's checkpoint
# holds the center and that resuming restores it (tests/distributed/test_shard_resume.py), and
# that a resume refuses what would change the run (tests/entry/test_run_dir.py); this adds a
# resume with another worker count end to end.
@pytest.mark.slow
def test_async_easgd_resumes_the_center_with_another_worker_count(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [
        "--method",
        "async-easgd",
        "--workers",
        "2",
        "--steps",
        "30",
        "--checkpoint-every",
        "10",
    ]
    args += ["--tau", "1"]  # an exchange every step (the method's default tau is 4)
    result = run_cli("train", *COMMON, *args, "--out", str(run))
    assert result.returncode == 0, result.stderr
    first = _summary(run)
    assert first["workers"] == 2 and first["steps"] == 30 and first["rounds"] >= 2 * 29
    assert first["lost_workers"] == [] and first["final_test_accuracy"] > 0.2
    checkpoint = torch.load(run / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == 30
    model = torch.load(run / "model.pt", weights_only=True)
    for name, tensor in checkpoint["model"].items():  # the saved model is the center
        assert torch.equal(model[name], tensor), name

    # Resume with three workers and a longer budget: training continues from the center (every
    # worker restarts from it, with any count). Three, not one: with one worker the elastic
    # rate 0.9/P pulls the center onto a single replica, and the accuracy check below would
    # measure that instead of the resume.
    result = run_cli("train", "--resume", str(run), "--workers", "3", "--steps", "50")
    assert result.returncode == 0, result.stderr
    resumed = _summary(run)
    assert resumed["workers"] == 3 and resumed["steps"] == 50
    steps = [h["step"] for h in resumed["history"]]
    assert steps[:3] == [10, 20, 30] and steps[-1] == 50
    assert resumed["final_test_accuracy"] >= first["final_test_accuracy"] - 0.05
