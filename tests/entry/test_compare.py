"""`tether compare`: one real run end to end, name checking, and a failed method not stopping it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import tether.catalog
import tether.runner
from tests.conftest import requires_fashion_mnist, run_cli
from tether.compare import run_comparison
from tether.config import TrainConfig
from tether.errors import TetherError, WorkerFailure
from tether.methods import METHODS


@requires_fashion_mnist
def test_compare_one_method_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = run_cli(
        "compare",
        *("--methods", "sync-sgd", "--workers", "2", "--steps", "12", "--eval-every", "6"),
        *("--batch-size", "32", "--no-progress", "--timeout", "20", "--out", str(out)),
    )
    assert result.returncode == 0, result.stderr
    assert "[1/1] sync-sgd" in result.stderr
    assert "| sync-sgd |" in result.stdout and str(out / "compare.md") in result.stdout

    summary = json.loads((out / "sync-sgd" / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["target_accuracy"] == 0.85
    data = json.loads((out / "compare.json").read_text())
    assert data["settings"]["workers"] == 2 and data["settings"]["steps"] == 12
    assert data["settings"]["epochs"] is None  # (it said 1 beside the 12 steps that ruled)
    assert data["settings"]["target_is_default"] is True
    (row,) = data["rows"]
    assert row["method"] == "sync-sgd" and row["status"] == "ok" and row["rounds"] == 12
    assert row["final_test_accuracy"] == summary["final_test_accuracy"]
    assert [h["step"] for h in row["history"]] == [6, 12]
    md = (out / "compare.md").read_text()
    assert "| sync-sgd |" in md and "comparison default" in md
    # its defaults' warm-up (half an epoch, cut to a quarter of 12 steps) and clip, which
    # the methods that have neither do not share: the row said neither
    assert "warm-up steps 3, clip 2" in md
    assert (out / "compare.png").stat().st_size > 10_000


def test_unknown_method_names_fail_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = run_cli("compare", "--methods", "sync-sgd,nope", "--out", str(out), timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    valid = ", ".join(METHODS.names())  # every registered method, sync-sgd among them
    assert lines[0] == f"tether: error: unknown method 'nope'; valid methods: {valid}"
    assert "sync-sgd" in valid
    assert not out.exists()


def test_each_methods_own_batch_is_checked_before_anything_runs(tmp_path: Path) -> None:
    # The comparison's own config is the default method's (sync-easgd holds 24 workers at 16
    # each: 384 samples); sync-sgd's 24 x 64 = 1536 is more than digits' 1500 training samples.
    # That used to surface as a failed row after its workers started, and compare.md named
    # sync-easgd's batch.
    out = tmp_path / "cmp"
    args = ("--methods", "sync-sgd,local-sgd", "--dataset", "digits", "--workers", "24")
    result = run_cli("compare", *args, "--out", str(out), timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "1536" in lines[0] and "1500" in lines[0], lines
    assert not out.exists()


def test_a_comparison_of_anything_but_accuracy_is_refused_up_front(tmp_path: Path) -> None:
    # --target made every method fail after start-up (compare adds its own target accuracy);
    # a run without accuracy ended in a KeyError traceback and wrote nothing
    base = TrainConfig(out=str(tmp_path / "c"), model="mlp", dataset="digits")
    with pytest.raises(TetherError, match=r"give --target-accuracy, not --target loss<=0\.9"):
        run_comparison(replace(base, target="loss<=0.9"), ["sync-sgd"])
    with pytest.raises(TetherError, match="add --metric accuracy"):
        run_comparison(replace(base, metrics=("mae",)), ["sync-sgd"])
    # a regression ran every method to an empty table and plot; the help offered --target
    with pytest.raises(TetherError, match=r"which a regression \(--loss mse\) does not have"):
        run_comparison(replace(base, loss="mse"), ["sync-sgd"])
    assert not (tmp_path / "c").exists()
    help_text = run_cli("compare", "--help").stdout
    assert "'loss<=0.3'" not in help_text and "not taken: tether compare times" in help_text


def test_a_failed_method_does_not_stop_the_comparison(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two fake methods: the first run fails, the second writes a summary; both are reported."""
    launched: list[tuple[str, int]] = []
    batches = {"works": 64, "held": 32}  # the batch each fake method ran with

    def fake_launch(config: TrainConfig, task_file: Path | None = None) -> None:
        launched.append((config.method, config.workers))
        if config.method == "broken":
            raise WorkerFailure("worker rank 1 failed: RuntimeError: boom", [1])
        run = Path(str(config.out))
        run.mkdir(parents=True, exist_ok=True)
        history = [{"time_s": 1.0, "step": 5, "epoch": 0.1, "test_accuracy": 0.9, "test_loss": 0.3}]
        summary = {
            "method": config.method,
            "workers": config.workers,
            "steps": 5,
            "final_test_accuracy": 0.9,
            "final_test_loss": 0.3,
            "wall_time_s": 1.5,
            "target_accuracy": config.target_accuracy,
            "time_to_target_s": 1.0,
            "comm_fraction": 0.1,
            "samples_per_s": 100.0,
            "time_split_s": {"data": 0.1, "compute": 2.0, "comm": 0.2},
            "settings": {"lr": 0.4, "batch_size": batches[config.method], "tau": 1},
            "alpha": 0.3,
            "history": history,
        }
        (run / "summary.json").write_text(json.dumps(summary))

    monkeypatch.setattr(METHODS, "get", lambda name: SimpleNamespace(server_processes=1))
    monkeypatch.setattr(tether.runner, "launch_training", fake_launch)
    monkeypatch.setattr(tether.catalog, "check_data", lambda *args: None)
    config = TrainConfig(workers=3, steps=5, target_accuracy=0.8, out=str(tmp_path))
    assert run_comparison(config, ["broken", "works"]) == 0
    assert launched == [("broken", 3), ("works", 3)]

    captured = capsys.readouterr()
    assert "[1/2] broken" in captured.err and "[2/2] works" in captured.err
    md = (tmp_path / "compare.md").read_text()
    assert "failed: worker rank 1 failed: RuntimeError: boom" in md
    assert "| works | 1.00 | 90.00% |" in md and "| works | 1.00 | 90.00% |" in captured.out
    assert "| lr 0.4, batch 64, tau 1, alpha 0.3 |" in md  # each row: what that method ran with
    assert "3 workers, batch 64 per worker (192 global)" in md  # what the runs shared
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert (tmp_path / "compare.png").exists()

    # The same --out again is refused before anything runs, unless overwritten.
    with pytest.raises(TetherError, match="holds a run"):
        run_comparison(config, ["works"])
    assert launched == [("broken", 3), ("works", 3)]
    # Every method failing is an error (exit code 1 in the CLI), after the files are written.
    with pytest.raises(WorkerFailure, match="broken failed, nothing to compare"):
        run_comparison(config, ["broken"], overwrite=True)
    assert not (tmp_path / "works" / "summary.json").exists()  # the earlier run was replaced
    # Methods that ran different batches (one held its global batch): no shared batch claimed.
    assert run_comparison(config, ["works", "held"], overwrite=True) == 0
    md = (tmp_path / "compare.md").read_text()
    assert "3 workers, each method's batch in its row" in md and "batch 32, tau 1" in md
