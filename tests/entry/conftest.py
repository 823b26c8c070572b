"""The uninterrupted `tether train` run that several end-to-end tests check: each launch costs
seconds on a 2-core machine, so one run serves its run directory's test, the crash and resume's
reference (tests/entry/test_train_e2e.py) and the timeline's test (test_timeline_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CliResult, run_cli

COMMON = ["--method", "sync-sgd", "--workers", "2", "--batch-size", "32", "--no-progress"]
COMMON += ["--timeout", "20", "--lr", "0.05"]
STRAIGHT_STEPS = 30
STRAIGHT = [*COMMON, "--steps", str(STRAIGHT_STEPS), "--eval-every", "10"]
STRAIGHT += ["--checkpoint-every", "10"]


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CliResult]:
    """sync-sgd on 2 workers and Fashion-MNIST (the tests using it need it installed): 30 steps,
    evaluated and checkpointed every 10, with --timeline. Its directory and the CLI's result."""
    run = tmp_path_factory.mktemp("straight") / "run"
    return run, run_cli("train", *STRAIGHT, "--timeline", "--out", str(run))
