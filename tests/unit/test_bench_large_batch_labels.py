"""The large-batch benchmark's ``--offline`` table says where its runs were made: the machines of
the runs the table shows (not of every run in the file), each field they share once, and how
many runs each made (a lent GPU machine is an H100 one session and an H200 the next)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_benchmark

H100 = {"cpu": "Xeon", "cores": "16", "gpu": "1 x NVIDIA H100", "torch": "2.11"}
H200 = {"cpu": "Xeon", "cores": "16", "gpu": "1 x NVIDIA H200", "torch": "2.11"}


def bench_large_batch() -> ModuleType:
    return load_benchmark("bench_large_batch")


def test_one_machine_is_its_own_label() -> None:
    assert bench_large_batch().merged_machine([H100, H100]) == H100


def test_several_machines_share_one_label_with_their_run_counts() -> None:
    merged = bench_large_batch().merged_machine([H200, H100, H200])
    assert merged == {
        "cpu": "Xeon",
        "cores": "16",
        "gpu": "1 x NVIDIA H200 / 1 x NVIDIA H100",  # in the runs' order: the file name stays
        "torch": "2.11",
        "runs": "2 on 1 x NVIDIA H200, 1 on 1 x NVIDIA H100",
    }


def _runs_file(path: Path, module: ModuleType, entries: list[tuple[float, dict | None]]) -> None:
    lines = []
    for lr, made_on in entries:
        entry = {"key": module._run_key("sync-sgd", 1, {"lr": lr}), "result": {"accuracy": lr}}
        if made_on is not None:
            entry["machine"] = {**made_on, "host": f"lease-{lr}"}  # leases differ by host only
        lines.append(json.dumps(entry))
    path.write_text("\n".join(lines) + "\n")


def test_a_table_is_labelled_with_the_machines_of_the_runs_it_shows(tmp_path: Path) -> None:
    module = bench_large_batch()
    cells = tmp_path / "cells.jsonl"
    _runs_file(cells, module, [(0.1, H200), (0.2, H100), (0.4, H100)])
    runs = module.Runs(cells, tmp_path, 1, reuse=True, offline=True)
    assert runs.fit({"lr": 0.2}) == {"accuracy": 0.2}
    assert runs.fit({"lr": 0.4}) == {"accuracy": 0.4}
    assert runs.machines_used() == [H100, H100]  # the H200's run is in the file, not the table


def test_a_shown_run_without_its_machine_is_refused(tmp_path: Path) -> None:
    module = bench_large_batch()
    cells = tmp_path / "cells.jsonl"
    _runs_file(cells, module, [(0.1, None), (0.2, H100)])
    runs = module.Runs(cells, tmp_path, 1, reuse=True, offline=True)
    runs.fit({"lr": 0.2})
    assert runs.machines_used() == [H100]  # the unlabelled run is not shown: no matter
    runs.fit({"lr": 0.1})
    with pytest.raises(SystemExit, match="do not record their machine"):
        runs.machines_used()


def test_the_result_file_says_how_many_runs_each_machine_made(monkeypatch, tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    module = bench_large_batch()
    common = sys.modules["_common"]  # the sibling the script imported
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    label = module.merged_machine([H200, H100, H200])
    common.write_part_result("Large-batch training", "table", ["| a |"], Figure(), label, 0.0)
    (written,) = tmp_path.glob("table_*.md")
    assert written.name == "table_1-x-nvidia-h200-1-x-nvidia-h100.md"
    lines = written.read_text().splitlines()
    assert "- machine: Xeon, 16 cores, 1 x NVIDIA H200 / 1 x NVIDIA H100, torch 2.11" in lines
    assert "- runs: 2 on 1 x NVIDIA H200, 1 on 1 x NVIDIA H100" in lines
