"""The comparison figure and files, from fake run summaries (no training, no processes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tether.observe.compare import (
    ROW_FIELDS,
    failed_row,
    row_from_summary,
    time_to_target,
    write_comparison,
)
from tether.observe.plots import plot_comparison, time_split_per_worker

TARGET = 0.8


def fake_summary(method: str, accuracies: list[float], **extra: Any) -> dict[str, Any]:
    """A summary.json as a 2-worker run writes it, with one evaluation per second."""
    history = [
        {"time_s": float(i + 1), "step": 10 * (i + 1), "epoch": 0.1, "test_accuracy": a}
        | {"test_loss": 1.0 - a}
        for i, a in enumerate(accuracies)
    ]
    summary = {
        "method": method,
        "workers": 2,
        "model": "lenet5",
        "dataset": "fashion-mnist",
        "seed": 0,
        "epochs": 0.5,
        "steps": 10 * len(accuracies),
        "global_batch_size": 64,
        "final_test_accuracy": accuracies[-1],
        "final_test_loss": 1.0 - accuracies[-1],
        "wall_time_s": float(len(accuracies)) + 0.5,
        "target_accuracy": None,
        "time_to_target_s": None,
        "comm_fraction": 0.25,
        "samples_per_s": 1234.4,
        # Summed over the 2 workers.
        "time_split_s": {"data": 0.2, "compute": 4.0, "comm": 1.6},
        "history": history,
    }
    return summary | extra


def settings(target_is_default: bool = False) -> dict[str, Any]:
    return {
        "model": "lenet5",
        "dataset": "fashion-mnist",
        "workers": 2,
        "batch_size": 32,
        "epochs": 1,
        "steps": 30,
        "lr": 0.05,
        "momentum": 0.9,
        "seed": 0,
        "backend": "gloo",
        "target_accuracy": TARGET,
        "target_is_default": target_is_default,
        "date": "2026-11-22T10:00:00+00:00",
    }


@pytest.fixture
def rows(tmp_path: Path) -> list[dict[str, Any]]:
    fast = fake_summary("sync-sgd", [0.5, 0.7, 0.82, 0.86])
    slow = fake_summary(
        "async-easgd",
        [0.4, 0.6, 0.75],
        rounds=7,
        lost_workers=[
            {"rank": 3, "lost_at": "2026-11-22T14:03:52+0000", "reason": "killed by SIGKILL"}
        ],
        comm_fraction=0.05,
    )
    return [
        row_from_summary(fast, TARGET, tmp_path / "sync-sgd"),
        row_from_summary(slow, TARGET, tmp_path / "async-easgd"),
        failed_row("hogwild-sgd", "worker rank 1 failed: RuntimeError: boom | bad", tmp_path),
    ]


def test_time_to_target_from_history_or_from_the_run() -> None:
    summary = fake_summary("sync-sgd", [0.5, 0.81, 0.9])
    assert time_to_target(summary, 0.8) == 2.0  # first evaluation at or above the target
    assert time_to_target(summary, 0.95) is None
    # The run timed itself against the same target: its own number wins.
    timed = summary | {"target_accuracy": 0.8, "time_to_target_s": 1.7}
    assert time_to_target(timed, 0.8) == 1.7
    assert time_to_target(timed, 0.85) == 3.0


def test_rows_have_the_same_keys_whether_ok_or_failed(rows: list[dict[str, Any]]) -> None:
    assert all(set(ROW_FIELDS) <= set(row) for row in rows)
    assert rows[0]["rounds"] == 40  # steps when the method does not count rounds
    assert rows[1]["rounds"] == 7
    assert rows[2]["status"] == "failed" and rows[2]["final_test_accuracy"] is None


def test_time_split_per_worker_fills_the_wall_time(rows: list[dict[str, Any]]) -> None:
    split = time_split_per_worker(rows[0])
    assert split is not None
    assert split["compute"] == pytest.approx(2.0) and split["comm"] == pytest.approx(0.8)
    assert sum(split.values()) == pytest.approx(rows[0]["wall_time_s"])
    assert time_split_per_worker(rows[2]) is None


def test_plot_writes_a_png(rows: list[dict[str, Any]], tmp_path: Path) -> None:
    path = plot_comparison(rows, tmp_path / "out" / "compare.png", title="t", target=TARGET)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # two panels with lines, bars and text, not an empty canvas
    # Only failures, no target: still a figure, no error.
    only_failed = plot_comparison(rows[2:], tmp_path / "failed.png", title="t")
    assert only_failed.stat().st_size > 10_000


def test_markdown_and_json(rows: list[dict[str, Any]], tmp_path: Path) -> None:
    json_path, md_path = write_comparison(tmp_path, rows, settings(target_is_default=True))
    md = md_path.read_text()
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 3
    assert table[0].startswith("| method | time to 80% (s) | final accuracy | samples/s |")
    sync, easgd, failed = table[2:]
    # seconds to the hundredth below 10 s (0.44 and 0.31 s were both "0.4" and "0.3")
    assert sync.split(" | ")[:7] == ["| sync-sgd", "3.00", "86.00%", "1234", "25.0%", "40", "4.50"]
    assert "not reached" in easgd and "| 7 |" in easgd
    # as the end-of-run summary says it (it was the summary's raw dict)
    assert "lost workers: rank 3 at 14:03:52 (killed by SIGKILL)" in easgd
    # A "|" in the error message must not break the table.
    assert "failed: worker rank 1 failed: RuntimeError: boom \\| bad" in failed
    assert failed.count(" | ") == 8  # nine cells: the escaped "|" is not a separator
    assert "model lenet5, dataset fashion-mnist, 2 workers, batch 32 per worker" in md
    assert "30 steps" in md and "2026-11-22" in md
    assert "target accuracy 80% (comparison default" in md
    assert "![" in md and "(compare.png)" in md

    data = json.loads(json_path.read_text())
    assert data["settings"]["target_accuracy"] == TARGET
    assert [r["method"] for r in data["rows"]] == ["sync-sgd", "async-easgd", "hogwild-sgd"]
    assert [r["status"] for r in data["rows"]] == ["ok", "ok", "failed"]
    assert data["rows"][0]["time_to_target_s"] == 3.0
    assert data["rows"][1]["time_to_target_s"] is None
    assert data["rows"][2]["error"].startswith("worker rank 1 failed")


def test_table_without_default_target_note(rows: list[dict[str, Any]], tmp_path: Path) -> None:
    _, md_path = write_comparison(tmp_path, rows[:1], settings(), figure=None)
    md = md_path.read_text()
    assert "target accuracy 80%." in md and "comparison default" not in md
    assert "![" not in md
