"""A hung worker of an asynchronous method under torchrun, which has no supervisor of ours: the
run goes on without it, and torchrun must not wait for its process afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent

# Rank 2 hangs in its loop (a stuck data loader, a deadlock: it sleeps, as they wait) after 20
# steps; rank 1 trains to its end; rank 0 serves.
HANGING_WORKER_SCRIPT = """
import sys, time
import torch
import tether

ctx = tether.init(method=sys.argv[1], timeout_s=5)
net = torch.nn.Linear(4, 2)
model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.01))
for step in range(300):
    if ctx.rank == 2 and step == 20:
        print("worker rank 2 hangs", flush=True)
        time.sleep(10**6)
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    time.sleep(0.01)
print(f"worker rank {ctx.rank} finished", flush=True)
ctx.finish()
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["async-sgd", "hogwild-sgd"])
def test_a_hung_worker_does_not_keep_torchrun_waiting(tmp_path: Path, method: str) -> None:
    # Before: the server gave the worker up and finished with the others, and torchrun waited
    # for the hung process for ever (no supervisor ends it). Now the server's END reaches the
    # worker's watch, which ends the process with status 0.
    script = tmp_path / "script.py"
    script.write_text(HANGING_WORKER_SCRIPT)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    torchrun = [str(VENV_BIN / "torchrun"), "--nproc-per-node", "3", str(script), method]
    started = time.monotonic()
    proc = subprocess.Popen(
        torchrun, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # so that a hung rank is ended with torchrun if this fails
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - started
    assert proc.returncode == 0, stderr[-3000:]
    assert "worker rank 2 hangs" in stdout
    assert "worker rank 1 finished" in stdout, stdout
    assert "tether: worker rank 2 was lost" in stderr, stderr[-3000:]  # the server's report
    assert "worker rank 2: the parameter server gave this worker up" in stderr, stderr[-3000:]
    assert "worker rank 1: the parameter server" not in stderr  # the healthy one left by itself
    assert took < 60, took  # start-up, the 5 s timeout, the 5 s grace
