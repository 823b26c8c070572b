"""Ctrl-C on a run: the terminal sends SIGINT to the whole foreground process group; `tether`
stops every worker and exits 130 with one line, without C++ aborts or torch's log lines, saying
how to go on from the run's checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import processes_mentioning, requires_fashion_mnist


@requires_fashion_mnist
@pytest.mark.parametrize("method", ["async-easgd"])  # the case: C++ aborts on Ctrl-C
def test_ctrl_c_is_one_clean_line(tmp_path: Path, method: str) -> None:
    run = tmp_path / "run"
    command = [sys.executable, "-m", "tether", "train", "--method", method, "--workers", "2"]
    command += ["--steps", "100000", "--no-progress", "--checkpoint-every", "20"]
    command += ["--out", str(run)]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # until its first checkpoint
        if (run / "checkpoint.pt").exists():
            break
        time.sleep(0.5)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    lines = [x for x in stderr.strip().splitlines() if not x.startswith("tether: warning:")]
    # and how to go on from where it stopped
    resume = f"it can go on from its last checkpoint: tether train --resume {run}"
    assert lines[-1] == f"tether: interrupted; {resume}", stderr
    assert len(lines) == 2, stderr  # the start line and this one
    for bad in ("terminate called", "Fatal Python error", "Traceback", "Aborted"):
        assert bad not in stderr, stderr
    time.sleep(1)
    assert processes_mentioning(str(run)) == []  # no worker outlives the run
