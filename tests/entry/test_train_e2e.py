"""`tether train` end to end, as a user runs it: run directory, resume, failures, torchrun.

Each run spawns real worker processes through torch's elastic launcher (a few seconds each), so
these tests are few and each checks many things.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch

from tests.conftest import CliResult, requires_fashion_mnist, run_cli
from tests.entry.conftest import COMMON, STRAIGHT, STRAIGHT_STEPS
from tether.observe.summary import missing_fields

pytestmark = requires_fashion_mnist


def _check_run_dir(run: Path, steps: int) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    assert missing_fields(summary) == []
    assert summary["steps"] == steps and summary["workers"] == 2
    assert summary["global_batch_size"] == 64
    assert 0.0 <= summary["comm_fraction"] < 1.0 and summary["samples_per_s"] > 0
    # the rate is over the training time: the wall time without the evaluations (with them,
    # a run's rate depended on how often it evaluated: 964 against 2734 samples/s)
    training = summary["wall_time_s"] - summary["evaluation_s"]
    assert summary["training_time_s"] == pytest.approx(training, abs=0.05)
    assert summary["history"][-1]["step"] == steps
    config = tomllib.loads((run / "config.toml").read_text())
    assert config["method"] == "sync-sgd" and config["batch_size"] == 32
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step_records = [r for r in records if "event" not in r]
    assert [r["step"] for r in step_records] == list(range(1, steps + 1))
    assert all(r["compute_s"] > 0 and r["comm_s"] >= 0 for r in step_records)
    # each step's training clock: it only moves forward (across a resume too), and an
    # evaluation is timed after the step it evaluates
    clock = [r["time_s"] for r in step_records]
    assert clock == sorted(clock) and clock[0] > 0, clock
    for entry in summary["history"]:
        assert clock[entry["step"] - 1] <= entry["time_s"], entry
    state = torch.load(run / "model.pt", weights_only=True)
    assert "conv1.weight" in state or any(k.endswith("weight") for k in state)
    return summary


# The uninterrupted run (tests/entry/conftest.py: straight_run, shared with the timeline's test).
def test_train_writes_the_run_directory(straight_run: tuple[Path, CliResult]) -> None:
    run, result = straight_run
    assert result.returncode == 0, result.stderr
    summary = _check_run_dir(run, STRAIGHT_STEPS)
    assert [h["step"] for h in summary["history"]] == [10, 20, 30]
    assert summary["final_test_accuracy"] > 0.2  # 30 steps of LeNet-5 beat chance (0.1)
    assert "test accuracy" in result.stdout and str(run) in result.stdout
    assert "tether: sync-sgd on 2 workers (2 processes), " in result.stderr  # the start line


def test_crash_then_resume_matches_uninterrupted_run(
    straight_run: tuple[Path, CliResult], tmp_path: Path
) -> None:
    straight, result = straight_run
    assert result.returncode == 0, result.stderr
    crashed = tmp_path / "crashed"

    # Rank 1 raises at step 25: the last checkpoint is step 20.
    fault = ["--set", "fault_rank=1", "--set", "fault_step=25"]
    result = run_cli("train", *STRAIGHT, *fault, "--out", str(crashed))
    assert result.returncode == 1
    assert "worker rank 1 failed: RuntimeError: injected fault at step 25" in result.stderr
    assert "Traceback" not in result.stderr
    assert "injected fault" in (crashed / "failures.log").read_text()
    assert not (crashed / "summary.json").exists()
    # The metrics up to the checkpoint reached the disk before the crash (they were buffered).
    lines = (crashed / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if '"event"' not in line]
    assert steps[:20] == list(range(1, 21)), steps

    result = run_cli("train", "--resume", str(crashed), "--set", "fault_rank=-1")
    assert result.returncode == 0, result.stderr
    summary = _check_run_dir(crashed, 30)  # metrics.jsonl: steps 1..30, each exactly once
    expected = torch.load(straight / "model.pt", weights_only=True)
    resumed = torch.load(crashed / "model.pt", weights_only=True)
    for name, tensor in expected.items():
        assert torch.equal(tensor, resumed[name]), name  # bitwise: same data, same arithmetic
    assert [h["step"] for h in summary["history"]] == [10, 20, 30]


@pytest.mark.parametrize(
    ("kind", "allreduce"),
    [("kill", "native"), ("hang", "native"), ("hang", "ring"), ("stop", "native")],
)
def test_dead_or_hung_worker_stops_the_run(tmp_path: Path, kind: str, allreduce: str) -> None:
    fault = ["--set", "fault_rank=1", "--set", "fault_step=5", "--set", f"fault_kind={kind}"]
    timeout = ["--timeout", "5", "--allreduce", allreduce]
    result = run_cli("train", *COMMON, *timeout, "--steps", "200", *fault, "--out", str(tmp_path))
    stopped = time.time()
    assert result.returncode == 1
    if kind == "kill":  # the killed rank first, then the peer that lost its connection to it
        error = result.stderr[result.stderr.index("tether: error:") :]
        assert error.startswith("tether: error: worker rank 1 failed: killed by SIGKILL"), error
        assert "typically caused" not in error, error
    elif kind == "stop":  # SIGSTOP: the agent's SIGTERM alone would wait 30 s for it
        assert "worker rank 1 was stopped (SIGSTOP) and stopped answering" in result.stderr
        assert "worker rank 0 failed" in result.stderr, result.stderr
    elif allreduce == "native":  # the survivor's gloo collective times out, naming itself...
        assert "worker rank 0 failed" in result.stderr and "Timed out" in result.stderr
        # ... and the launcher names the rank that stopped answering, first
        said = "worker rank 1 did not fail itself and stopped answering"
        assert said in result.stderr, result.stderr
        assert result.stderr.find(said) < result.stderr.find("worker rank 0 failed")
    else:  # our schedules also name the rank they waited for; the hung rank is then killed
        said = "worker rank 0 failed: PeerStalled: ring schedule, rank 0: gave up"
        assert said in result.stderr and "rank 1 in round" in result.stderr, result.stderr
        assert "Timed out" in result.stderr
    # From the moment of the fault to the end of the `tether` process: under 10 s, --timeout
    # + 5 s (for a hang this includes the 5 s collective timeout).
    fault_at = float((tmp_path / "injected_fault.txt").read_text())
    assert stopped - fault_at < 10, stopped - fault_at


def test_torchrun_runs_the_same_worker_entry(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "tether.run", "--method"]
    cmd += ["sync-sgd"]
    cmd += ["--batch-size", "32", "--no-progress", "--steps", "12", "--eval-every", "6"]
    cmd += ["--staleness-bound", "2"]  # which sync-sgd ignores: a warning
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("test accuracy") == 1  # rank 0 prints the summary, as tether train
    # in one line, as tether train says it (it was Python's two, pointing inside tether/run.py)
    warned = [line for line in proc.stderr.splitlines() if "staleness" in line]
    assert warned and all(line.startswith("tether: warning: ") for line in warned), warned
    summary = _check_run_dir(tmp_path, 12)
    assert summary["workers"] == 2


# Slow: the bitwise resume from per-rank shards of every replica method (two-level-easgd's 2 nodes
# of 2 included) is checked through the trainer on one spawned group, with sync-easgd's center
# evaluation (tests/distributed/test_shard_resume.py); a resume keeping the shards, in
# tests/entry/test_run_dir.py; the crash and resume through the command line, by
# test_crash_then_resume_matches_uninterrupted_run.
@pytest.mark.slow
@pytest.mark.parametrize(
    "method, layout",
    [
        ("sync-easgd", ["--workers", "2"]),
        ("local-sgd", ["--workers", "2"]),
        ("two-level-easgd", ["--workers", "4", "--ranks-per-node", "2"]),
    ],
)
def test_replicas_resume_bitwise_from_their_shards(
    tmp_path: Path, method: str, layout: list[str]
) -> None:
    # Every rank checkpoints its own replica and optimizer: a crash and resume with the same
    # workers gives the weights of the uninterrupted run. (Before: every worker restarted from
    # the center, or from rank 0's replica, and the runs differed by up to 0.1.)
    args = ["--method", method, *layout, "--batch-size", "32", "--no-progress"]
    args += ["--timeout", "20", "--steps", "30", "--eval-every", "10", "--checkpoint-every", "10"]
    args += ["--tau", "3"]  # the checkpoint at step 20 falls between two averagings
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    assert run_cli("train", *args, "--out", str(straight)).returncode == 0
    if method == "sync-easgd":
        # What sync-easgd evaluates is its center: 30 steps, an elastic round every 3,
        # alpha = 0.9 / 2 workers, and above chance.
        summary = json.loads((straight / "summary.json").read_text())
        assert summary["rounds"] == 10 and summary["tau"] == 3 and summary["alpha"] == 0.45
        assert summary["final_test_accuracy"] > 0.2
    fault = ["--set", "fault_rank=1", "--set", "fault_step=25"]
    assert run_cli("train", *args, *fault, "--out", str(crashed)).returncode == 1
    workers = int(layout[1])
    assert sorted(p.name for p in (crashed / "checkpoint-ranks").iterdir()) == [
        f"rank-{r}.pt" for r in range(workers)
    ]
    result = run_cli("train", "--resume", str(crashed), "--set", "fault_rank=-1")
    assert result.returncode == 0, result.stderr
    expected = torch.load(straight / "model.pt", weights_only=True)
    resumed = torch.load(crashed / "model.pt", weights_only=True)
    for name, tensor in expected.items():
        assert torch.equal(tensor, resumed[name]), name
    accuracy = [
        json.loads((r / "summary.json").read_text())["final_test_accuracy"]
        for r in (straight, crashed)
    ]
    assert accuracy[0] == accuracy[1]
