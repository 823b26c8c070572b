"""Model parallelism through `tether train`: LeNet-5 split over model groups of 2, 2 of them
(4 processes), against the shared 2-worker sync-sgd run (tests/entry/conftest.py) with the same
global batch: the same weights within 1e-5 (relative to the largest), since each model group
computes the unsharded gradient of its share of the batch and sync-sgd averages them over the
data-parallel groups. Also: what the run directory holds, and its resume (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import CliResult, requires_fashion_mnist, run_cli
from tests.entry.conftest import STRAIGHT, STRAIGHT_STEPS
from tether.cli import main
from tether.models import build_model

PLAN = "features.0=channel,features.3=input-channel,classifier.1=column,classifier.3=row"
# The shared run's options, on 4 workers in model groups of 2: the same global batch (2 x 32).
# (argparse keeps an option's last value: --workers 4 replaces the shared run's 2)
GRID = [*STRAIGHT, "--workers", "4", "--model-parallel", "2", "--parallel-plan", PLAN]
REL_TOL = 1e-5


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CliResult]:
    run = tmp_path_factory.mktemp("grid") / "run"
    return run, run_cli("train", *GRID, "--out", str(run))


@requires_fashion_mnist
def test_a_model_parallel_run_equals_data_parallel_training(grid_run, straight_run):
    run, result = grid_run
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 4 and summary["model_parallel"] == 2
    assert summary["global_batch_size"] == 64 and summary["steps"] == STRAIGHT_STEPS
    # every sample counted once, though both ranks of a model group process it
    samples = summary["samples_per_s"] * summary["training_time_s"]
    assert samples == pytest.approx(STRAIGHT_STEPS * 64, rel=1e-6)
    ours = torch.load(run / "model.pt", weights_only=True)
    theirs = torch.load(straight_run[0] / "model.pt", weights_only=True)
    # model.pt is the unsharded model's state_dict: it loads into LeNet-5 as it is.
    build_model("lenet5", (1, 28, 28), 10).load_state_dict(ours)
    scale = max(float(v.abs().max()) for v in theirs.values())
    worst = max(float((ours[k] - theirs[k]).abs().max()) for k in theirs)
    assert worst / scale < REL_TOL, worst
    # every rank checkpointed its own slices and optimizer state
    shards = sorted(p.name for p in (run / "checkpoint-ranks").iterdir())
    assert shards == [f"rank-{r}.pt" for r in range(4)]


@requires_fashion_mnist
@pytest.mark.slow
def test_a_model_parallel_run_resumes_bitwise(grid_run, tmp_path: Path):
    run, result = grid_run
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = tmp_path / "resumed"
    first = run_cli("train", *GRID, "--steps", "20", "--out", str(resumed))
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli("train", "--resume", str(resumed), "--steps", str(STRAIGHT_STEPS))
    assert again.returncode == 0, again.stderr[-3000:]
    ours = torch.load(resumed / "model.pt", weights_only=True)
    theirs = torch.load(run / "model.pt", weights_only=True)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["train", "--no-progress", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    err = [line for line in lines if not line.startswith("tether: warning: ")]
    assert len(err) == 1 and err[0].startswith("tether: error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "4", "--model-parallel", "3"], "--model-parallel (3) must divide the 4"),
        (
            ["--method", "async-sgd", "--model-parallel", "2", "--parallel-plan", "x=row"],
            "async-sgd does not run with model parallelism",
        ),
        (
            ["--method", "sync-sgd", "--model-parallel", "2", "--parallel-plan", "fc=diagonal"],
            "kinds are column, row, channel, input-channel",
        ),
    ],
)
def test_bad_grids_are_one_line(capsys, argv: list[str], message: str) -> None:
    assert message in _error(capsys, *argv)


@requires_fashion_mnist
@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ("", "needs a plan naming the layers to split, e.g. --parallel-plan"),
        ("features.9=column", "the model has no layer 'features.9'; its Linear/Conv2d layers"),
        ("classifier.5=column", "classifier.5 has 10 output features, which do not split into 4"),
        ("features.1=column", "features.1 is a ReLU; only Linear and Conv2d layers"),
    ],
)
def test_plans_are_checked_against_the_model_before_launch(capsys, plan: str, message: str):
    argv = ["--method", "sync-sgd", "--workers", "4", "--model-parallel", "4"]
    assert message in _error(capsys, *argv, *(["--parallel-plan", plan] if plan else []))
