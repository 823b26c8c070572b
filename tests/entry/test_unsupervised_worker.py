"""Hung and failing ranks under torchrun, which has no supervisor of ours: a hung worker of an
asynchronous method is left behind and torchrun must not wait for its process afterwards; one
whose own code raises is lost without taking the others with it; a server hung after its
workers' last replies (in its serving loop, or after it) fails the run naming it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.entry.test_api_e2e import HANGING_SERVER_TEMPLATE
from tether.launch.proctree import kill_tree

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


def _launched(command: list[str], cwd: Path) -> tuple[int, str, str, float]:
    """``command`` (a launcher of 3 processes) in ``cwd``, which is on the path: status, stdout,
    stderr and seconds; every process of it ended, whatever happens (a session of its own)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), env.get("PYTHONPATH", "")])
    started = time.monotonic()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
        start_new_session=True,  # so that a hung rank is ended with the launcher if this fails
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        kill_tree(proc.pid)  # the ranks may live in sessions of their own (torchrun's do)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, stdout, stderr, time.monotonic() - started


def _torchrun(argv: list[str], cwd: Path) -> tuple[int, str, str, float]:
    """``torchrun --nproc-per-node 3 ARGV`` in ``cwd``: :func:`_launched`."""
    return _launched([str(VENV_BIN / "torchrun"), "--nproc-per-node", "3", *argv], cwd)


def _mpiexec(argv: list[str], cwd: Path) -> tuple[int, str, str, float]:
    """``mpiexec -n 3 python ARGV`` in ``cwd``: :func:`_launched`."""
    return _launched([str(VENV_BIN / "mpiexec"), "-n", "3", sys.executable, *argv], cwd)


NO_MPIEXEC = not (VENV_BIN / "mpiexec").exists()
LAUNCHERS = [
    pytest.param(_torchrun, id="torchrun"),
    pytest.param(_mpiexec, id="mpiexec", marks=pytest.mark.skipif(NO_MPIEXEC, reason="no mpi")),
]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("method", ["async-sgd", "hogwild-sgd"])
def test_a_hung_worker_does_not_keep_the_launcher_waiting(
    tmp_path: Path, method: str, launcher: Any
) -> None:
    # Before: the server gave the worker up and finished with the others, and torchrun waited
    # for the hung process for ever (no supervisor ends it); under mpiexec the others, done,
    # waited for it in MPI's finalize. Now the server's END reaches the worker's watch, which
    # ends the process with status 0 (under MPI once its finalize has waited for the others).
    script = tmp_path / "script.py"
    script.write_text(HANGING_WORKER_SCRIPT)
    code, stdout, stderr, took = launcher([str(script), method], tmp_path)
    assert code == 0, stderr[-3000:]
    assert "worker rank 2 hangs" in stdout
    assert "worker rank 1 finished" in stdout, stdout
    assert "tether: worker rank 2 was lost" in stderr, stderr[-3000:]  # the server's report
    assert "worker rank 2: the parameter server gave this worker up" in stderr, stderr[-3000:]
    assert "worker rank 1: the parameter server" not in stderr  # the healthy one left by itself
    assert took < 60, took  # start-up, the 5 s timeout, the 5 s grace


# The user's components for `torchrun -m tether.run`: the evaluation set's reads past its first
# sample (which the server reads at its start) never return, as on a stuck mount. With one
# evaluation at the end, the server hangs once every worker has finished.
STUCK_EVALUATION_MODULE = """
import time
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset


class StuckEval(Dataset):
    def __init__(self):
        self.x = torch.randn(48, 6, generator=torch.Generator().manual_seed(1))
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return 48

    def __getitem__(self, i):
        if i > 0:
            time.sleep(10**6)
        return self.x[i], self.y[i]


def load():
    x = torch.randn(1024, 6, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, (x[:, 0] > 0).long()), StuckEval()


def net():
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
"""


@pytest.mark.slow
def test_a_server_hung_after_its_workers_finished_fails_the_torchrun_run(tmp_path: Path) -> None:
    # Before: torchrun waited for the hung server for ever (its supervisor's watch exists under
    # tether train and tether.fit only). Now it watches itself once its serving is over.
    (tmp_path / "stuck.py").write_text(STUCK_EVALUATION_MODULE)
    train = ["--model", "stuck:net", "--dataset", "stuck:load", "--steps", "10"]
    train += ["--batch-size", "16", "--eval-every", "1000", "--timeout", "3", "--no-progress"]
    code, _, stderr, took = _torchrun(
        ["-m", "tether.run", "--method", "async-sgd", *train], tmp_path
    )
    assert code == 1, stderr[-3000:]
    said = "tether: server rank 0 stopped answering after every worker had finished: its pulse"
    assert said in stderr, stderr[-3000:]
    assert "in __getitem__" in stderr and "time.sleep(10**6)" in stderr  # where it hung
    assert not list(tmp_path.glob("runs/*/summary.json"))  # no results from the hung evaluation
    assert took < 45, took  # start-up, 10 steps, then the 3 s timeout


@pytest.mark.slow
@pytest.mark.parametrize("method", ["async-sgd", "original-easgd"])
def test_a_server_hung_after_its_workers_last_replies_fails_the_torchrun_run(
    tmp_path: Path, method: str
) -> None:
    # The evaluation at the last step runs inside the serving loop, after the workers' last
    # replies went out. Before: they said goodbye (no answer awaited) and left with status 0,
    # and torchrun waited for the hung server for ever (still running at 60 s). Now the loop
    # watches its own pulse (first come first served, and round-robin's turns).
    (tmp_path / "stuck.py").write_text(STUCK_EVALUATION_MODULE)
    train = ["--model", "stuck:net", "--dataset", "stuck:load", "--steps", "10"]
    train += ["--batch-size", "16", "--eval-every", "10", "--timeout", "3", "--no-progress"]
    code, _, stderr, took = _torchrun(["-m", "tether.run", "--method", method, *train], tmp_path)
    assert code == 1, stderr[-3000:]
    said = "tether: server rank 0 stopped answering while it served its workers: its pulse"
    assert said in stderr, stderr[-3000:]
    assert "in __getitem__" in stderr  # where it hung
    assert took < 45, took


# A healthy run the workers wait for: the server's first evaluation batch takes 4 s against a
# --timeout of 3 s, while each worker's step takes 1.5 s (a worker reads the server's "busy" at
# its next exchange, up to a step later, and then waits a timeout).
SLOW_EVALUATION_MODULE = """
import time
import torch
from torch import nn
from torch.utils.data import TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 2)
        self.slept = False

    def forward(self, x):
        if self.training:
            time.sleep(1.5)
        elif x.shape[0] > 1 and not self.slept:  # the first evaluation batch (not the probe)
            self.slept = True
            time.sleep(4.0)
        return self.lin(x)


def load():
    x = torch.randn(256, 6, generator=torch.Generator().manual_seed(0))
    e = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    return TensorDataset(x, (x[:, 0] > 0).long()), TensorDataset(e, (e[:, 0] > 0).long())
"""


@pytest.mark.slow
def test_a_server_busy_longer_than_the_timeout_its_workers_wait_out_is_left_alone(
    tmp_path: Path,
) -> None:
    # The serving loop's own watch first used the workers' timeout for its stillness: one
    # evaluation batch longer than it ended a healthy server that its workers were still
    # waiting for (found by review: status 1, where tether train and the code before succeeded).
    (tmp_path / "slow.py").write_text(SLOW_EVALUATION_MODULE)
    train = ["--model", "slow:Net", "--dataset", "slow:load", "--steps", "6", "--eval-every", "3"]
    train += ["--batch-size", "16", "--timeout", "3", "--no-progress", "--out", "run"]
    code, _, stderr, _ = _torchrun(["-m", "tether.run", "--method", "async-sgd", *train], tmp_path)
    assert code == 0, stderr[-3000:]
    assert "stopped answering" not in stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 6


# Rank 2's own code raises after 20 steps (a corrupt sample); rank 1 trains to its end.
FAILING_WORKER_SCRIPT = HANGING_WORKER_SCRIPT.replace(
    'print("worker rank 2 hangs", flush=True)\n        time.sleep(10**6)',
    'raise ValueError("a corrupt sample in worker 2\'s shard")',
)

# For `torchrun -m tether.run`: worker rank 2's training data fails on its 40th read.
FAILING_DATA_MODULE = """
import os
import torch
from torch import nn
from torch.utils.data import Dataset


class Data(Dataset):
    def __init__(self):
        self.x = torch.randn(4096, 6, generator=torch.Generator().manual_seed(0))
        self.reads = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.reads += 1
        if os.environ["RANK"] == "2" and self.reads == 40:
            raise OSError("a corrupt sample in worker 2's shard")
        return self.x[i], (self.x[i, 0] > 0).long()


def load():
    return Data(), Data()


def net():
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
"""


@pytest.mark.slow
def test_a_worker_whose_code_raises_does_not_end_the_others(tmp_path: Path) -> None:
    # Before: torchrun stopped every rank when rank 2 failed (status 1, rank 1 never finished).
    # Now the failing worker says why and leaves with status 0; the server gives it up.
    script = tmp_path / "script.py"
    script.write_text(FAILING_WORKER_SCRIPT)
    code, stdout, stderr, _ = _torchrun([str(script), "async-sgd"], tmp_path)
    assert code == 0, stderr[-3000:]
    assert "worker rank 1 finished" in stdout and "worker rank 2 finished" not in stdout
    assert "ValueError: a corrupt sample in worker 2's shard" in stderr  # its traceback
    assert (
        "tether: worker rank 2 failed (ValueError: a corrupt sample in worker 2's shard); "
        "async-sgd carries on without it" in stderr
    ), stderr[-3000:]
    assert "tether: worker rank 2 was lost" in stderr  # the server's report
    # The same through the trainer (torchrun -m tether.run): the run's summary lists it.
    (tmp_path / "failing.py").write_text(FAILING_DATA_MODULE)
    train = ["--model", "failing:net", "--dataset", "failing:load", "--steps", "30"]
    train += ["--batch-size", "8", "--timeout", "5", "--no-progress", "--out", "run"]
    code, _, stderr, _ = _torchrun(["-m", "tether.run", "--method", "async-sgd", *train], tmp_path)
    assert code == 0, stderr[-3000:]
    assert "tether: worker rank 2 failed (OSError: a corrupt sample" in stderr, stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [lost["rank"] for lost in summary["lost_workers"]] == [2]
    assert "closed its connection" in summary["lost_workers"][0]["reason"]


@pytest.mark.slow
def test_workers_that_give_a_hung_hogwild_server_up_end_the_torchrun_run(tmp_path: Path) -> None:
    # Hogwild workers find a hung server by its pulse on the shared board, outside any exchange:
    # taken for their own failure, they left with status 0 and torchrun waited for the hung
    # server for ever (found by review). Their link is marked broken now, so they fail.
    script = tmp_path / "script.py"
    script.write_text(
        HANGING_SERVER_TEMPLATE.format(
            setup="", init='method="hogwild-sgd", timeout_s=5', delay=3.0, steps=6000
        )
    )
    code, _, stderr, took = _torchrun([str(script)], tmp_path)
    assert code != 0, stderr[-3000:]
    assert "pulse stood still" in stderr, stderr[-3000:]
    assert "carries on without it" not in stderr
    assert took < 60, took


@pytest.mark.slow
@pytest.mark.skipif(NO_MPIEXEC, reason="no mpiexec (the mpi extra)")
def test_under_mpiexec_a_failing_worker_waits_for_the_others_in_finalize(tmp_path: Path) -> None:
    # What the README says of mpiexec: no rule of ours there, the failing rank's exit waits in
    # MPI's finalize (mpi4py's, at exit) for the others, which carry on; the job's status is 1.
    script = tmp_path / "script.py"
    script.write_text(FAILING_WORKER_SCRIPT)
    code, stdout, stderr, _ = _mpiexec([str(script), "async-sgd"], tmp_path)
    assert code == 1, stderr[-3000:]
    assert "worker rank 1 finished" in stdout, stderr[-3000:]
    assert "ValueError: a corrupt sample in worker 2's shard" in stderr
    assert "tether: worker rank 2 was lost" in stderr  # the server's report


@pytest.mark.slow
def test_a_run_whose_every_worker_failed_fails(tmp_path: Path) -> None:
    # Each failing worker leaves with status 0 (its own failure), so the server's status must
    # say that none finished: it exited 0 and the run "succeeded" (found by review).
    script = tmp_path / "script.py"
    script.write_text(
        FAILING_WORKER_SCRIPT.replace("if ctx.rank == 2 and step == 20", "if step == 20")
    )
    code, stdout, stderr, _ = _torchrun([str(script), "async-sgd"], tmp_path)
    assert code != 0, stderr[-3000:]
    assert stderr.count("carries on without it") == 2 and "finished" not in stdout
    assert "tether: error: server rank 0: every worker was lost" in stderr, stderr[-3000:]


# The server hangs 3 s after it joined (in its serving loop, a deadlock), while its workers
# still have a little training to do: they finish before its pulse has stood still long enough
# for them to give it up, and a Hogwild worker's goodbye waits for no answer.
LATE_HUNG_SERVER_SCRIPT = HANGING_SERVER_TEMPLATE.format(
    setup="", init="method=sys.argv[1], timeout_s=5", delay=3.0, steps=600
)


@pytest.mark.slow
def test_a_hogwild_server_hung_near_the_end_fails_the_torchrun_run(tmp_path: Path) -> None:
    # Before: both workers finished and left, and torchrun waited for the hung server for ever
    # (found by a fault sweep: still running at 120 s). The server now watches its own pulse
    # while it serves, by the rule its workers apply to it.
    script = tmp_path / "script.py"
    script.write_text(LATE_HUNG_SERVER_SCRIPT)
    code, _, stderr, took = _torchrun([str(script), "hogwild-sgd"], tmp_path)
    assert code != 0, stderr[-3000:]
    said = "tether: server rank 0 stopped answering while it served its workers: its pulse"
    assert said in stderr, stderr[-3000:]
    assert took < 60, took
