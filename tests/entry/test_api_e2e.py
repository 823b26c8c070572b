"""The user's API end to end: ``tether.fit`` from a script, ``tether.init`` under torchrun and
mpiexec for all ten methods, ``tether launch``, import paths on the command line, the examples,
and bad input refused in one line before any worker starts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import TensorDataset

import tether
from tests.conftest import listening_sockets_of, requires_fashion_mnist, run_cli
from tether.cli import main as cli_main
from tether.data.sharding import GlobalBatchSampler
from tether.errors import TetherError
from tether.launch.proctree import kill_tree
from tether.methods import METHODS
from tether.training.norm_stats import calibration_subset

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
VENV_BIN = Path(sys.executable).parent
ALL_METHODS = ",".join(METHODS.names())
CHANCE = 0.1  # ten digit classes
REL_TOL = 1e-5


def _run(command: list[str], timeout: float = 240, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``command``'s status and output; past ``timeout``, every process it started is killed
    (a launcher's ranks live in sessions of their own: a hung one would outlive the test)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _launch(
    tmp_path: Path, text: str, workers: int, method: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """``tether launch --workers N --method M script.py ARGS`` of a script with ``text``."""
    script = tmp_path / "script.py"
    script.write_text(text)
    command = [sys.executable, "-m", "tether", "launch", "--workers", str(workers)]
    return _run([*command, "--method", method, str(script), *args], timeout=timeout)


def _records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _check_all_methods(stdout: str, processes: int) -> None:
    records = _records(stdout)
    for method in METHODS.names():
        mine = [r for r in records if r["method"] == method]
        servers = METHODS.get(method).server_processes
        assert len(mine) == processes, (method, mine)
        assert sum(r["role"] == "server" for r in mine) == servers, (method, mine)
        workers = [r for r in mine if r["role"] == "worker"]
        for record in workers:
            # 40 steps of 16 samples: far from converged, far above chance.
            assert record["accuracy"] > 3 * CHANCE, record
        if not servers:  # replicated methods evaluate the same model on every rank
            assert len({r["checksum"] for r in workers}) == 1, (method, workers)


def test_every_method_through_init_under_torchrun() -> None:
    script = str(ROOT / "tests/entry/init_all_methods.py")
    torchrun = [str(VENV_BIN / "torchrun"), "--nproc-per-node", "3", script, ALL_METHODS]
    result = _run(torchrun)
    assert result.returncode == 0, result.stderr[-3000:]
    _check_all_methods(result.stdout, 3)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpiexec", path=str(VENV_BIN)) is None, reason="no mpiexec")
def test_every_method_through_init_under_mpiexec() -> None:
    script = str(ROOT / "tests/entry/init_all_methods.py")
    mpiexec = [str(VENV_BIN / "mpiexec"), "-n", "3", sys.executable, script, ALL_METHODS]
    result = _run(mpiexec)
    assert result.returncode == 0, result.stderr[-3000:]
    _check_all_methods(result.stdout, 3)


# -- tether.fit ----------------------------------------------------------------------------------
def data() -> tuple[TensorDataset, TensorDataset]:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(256, 6, generator=gen)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:])


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class MixedDtypes(nn.Module):
    """Runs (it casts between its layers), but its parameters cannot share one flat buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.out = nn.Linear(4, 2).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(x).double()).float()


def momentum_sgd(params):  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.2, momentum=0.9)


def _single_process(steps: int, per_worker: int, workers: int) -> torch.Tensor:
    train, _ = data()
    torch.manual_seed(0)  # fit seeds with the run's seed (0) before building the model
    model = Tiny()
    opt = momentum_sgd(model.parameters())
    sampler = GlobalBatchSampler(len(train), per_worker * workers, seed=0)
    x, y = train.tensors
    for step in range(steps):
        idx = sampler.global_indices(step)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_fit_sync_sgd_equals_one_process_and_sync_easgd_is_bitwise(tmp_path: Path) -> None:
    train, test = data()
    listening_before = listening_sockets_of(os.getpid())
    result = tether.fit(
        model=Tiny,
        train_data=train,
        eval_data=test,
        loss=nn.CrossEntropyLoss(),
        optimizer=momentum_sgd,
        method="sync-sgd",
        workers=2,
        batch_size=8,
        steps=10,
        eval_every=5,
        log="tensorboard",
        out=tmp_path / "sgd",
    )
    fitted = torch.cat([p.detach().reshape(-1) for p in result.model.parameters()])
    reference = _single_process(steps=10, per_worker=8, workers=2)
    assert float((fitted - reference).abs().max() / reference.abs().max()) < REL_TOL
    assert result.summary["steps"] == 10 and result.summary["model"] == "Tiny"
    # the rate the user's optimizer ran with, not the method's default, in compare's row too
    assert result.summary["lr"] == 0.2 and result.summary["settings"]["lr"] == 0.2
    assert result.history and result.history[-1]["test_accuracy"] > 0.7
    events = EventAccumulator(str(tmp_path / "sgd" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 11))
    assert [e.step for e in events.Scalars("test/accuracy")] == [5, 10]
    runs = [
        tether.fit(
            model=Tiny,
            train_data=train,
            eval_data=test,
            method="sync-easgd",
            workers=2,
            batch_size=8,
            steps=12,
            out=tmp_path / f"easgd-{i}",
        )
        for i in range(2)
    ]
    a, b = (torch.cat([p.reshape(-1) for p in r.model.parameters()]) for r in runs)
    assert torch.equal(a, b) and not torch.equal(a, runs[0].model.fc.weight.new_zeros(a.shape))
    # Three runs launched from this process; their stores (the rendezvous and the workers') were
    # closed with each: nothing of them still listens here (each used to keep two listening).
    assert listening_sockets_of(os.getpid()) <= listening_before


def test_fit_refuses_bad_input_before_any_worker_starts(tmp_path: Path) -> None:
    train, test = data()

    def vector(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets, reduction="none")

    holding_a_lock = TensorDataset(*train.tensors)
    holding_a_lock.lock = threading.Lock()  # type: ignore[attr-defined]
    cases = [
        ({"model": lambda: Tiny()}, r"^model cannot be sent to the worker processes"),
        ({"train_data": holding_a_lock}, r"^train_data cannot be sent .*lock"),
        ({"loss": vector}, r"the loss must return a scalar tensor"),
        ({"method": "nope"}, r"unknown method 'nope'"),
        ({"target": ("accuracy", "high")}, r"target must be"),
        ({"train_data": "digits", "eval_data": test}, r"brings its own evaluation split"),
        ({"optimizer": "nope"}, r"valid optimizers"),
        ({"model": MixedDtypes}, r"^sync-easgd packs .* float64 on cpu \(out\.weight, out\.bias\)"),
    ]
    for change, message in cases:
        arguments = {"model": Tiny, "train_data": train, "eval_data": test, **change}
        with pytest.raises(TetherError, match=message):
            tether.fit(**arguments, out=tmp_path / "never")  # type: ignore[arg-type]
        assert not (tmp_path / "never" / "summary.json").exists()


# -- the command line takes the user's components --------------------------------------------------
USER_MODULE = """
import torch
from torch import nn
from torch.utils.data import TensorDataset


def build():
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def load():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 0.1 * torch.randn(512, generator=gen)
    return TensorDataset(x[:384], y[:384]), TensorDataset(x[384:], y[384:])


def within_half(outputs, targets):
    return float(((outputs.squeeze(1) - targets).abs() < 0.5).float().mean())


def per_sample(outputs, targets):
    return (outputs.squeeze(1) - targets) ** 2
"""


def test_cli_trains_the_users_components_by_import_path(tmp_path: Path) -> None:
    (tmp_path / "mytask.py").write_text(USER_MODULE)
    out = tmp_path / "run"
    args = [
        "train",
        "--method",
        "local-sgd",
        "--workers",
        "2",
        "--model",
        "mytask:build",
        "--dataset",
        "mytask:load",
        "--loss",
        "mse",
        "--optimizer",
        "adamw",
        "--lr",
        "0.01",
        "--lr-schedule",
        "cosine",
        "--warmup-steps",
        "5",
        "--metric",
        "mae",
        "--metric",
        "mytask:within_half",
        "--steps",
        "60",
        "--target",
        "loss<=0.5",
        "--out",
        str(out),
        "--no-progress",
    ]
    result = _run([sys.executable, "-m", "tether", *args], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    final = summary["final_metrics"]
    assert set(final) == {"loss", "mae", "within_half"}
    assert final["loss"] < 0.5 and summary["time_to_target_s"] is not None
    assert summary["optimizer"] == "AdamW" and summary["lr_schedule"] == "cosine"  # as asked
    assert summary["final_test_accuracy"] is None  # a regression has no accuracy
    assert "test loss" in result.stdout and "mae" in result.stdout


def test_cli_refuses_a_bad_import_path_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # In this process (a subprocess per refusal cost 3 s of torch's import each): the CLI puts
    # the working directory on sys.path, as `python -m tether` run there would have it.
    (tmp_path / "mytask.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for option, value, message in (
        ("--model", "mytask:nope", "module mytask has no attribute 'nope'"),
        ("--dataset", "missing_module:load", "no module named 'missing_module'"),
        ("--loss", "mytask", "unknown loss 'mytask'; valid losses"),
        ("--loss", "mytask:per_sample", "must return a scalar tensor, got a tensor of shape"),
    ):
        argv = ["train", option, value, "--no-progress"]
        if value == "mytask:per_sample":  # the dry run needs the user's model and data too
            argv += ["--model", "mytask:build", "--dataset", "mytask:load"]
        try:
            assert cli_main(argv) == 2
        finally:
            sys.modules.pop("mytask", None)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_a_setting_the_method_ignores_is_named(tmp_path: Path) -> None:
    # The warnings come before the data check, which fails here: nothing is launched.
    result = run_cli(
        "train",
        "--method",
        "sync-easgd",
        "--momentum",
        "0.5",
        "--staleness-bound",
        "3",
        "--data-dir",
        str(tmp_path / "nothing"),
    )
    assert result.returncode == 2
    assert "warning: sync-easgd ignores momentum" in result.stderr
    assert "warning: sync-easgd ignores staleness_bound (it applies to async-sgd" in result.stderr


@requires_fashion_mnist
def test_a_warm_up_longer_than_the_run_is_named(tmp_path: Path) -> None:
    """Through the CLI and tether.fit, before launch (a run directory that holds a run stops
    both right after: nothing is started)."""
    held = tmp_path / "held"
    held.mkdir()
    (held / "summary.json").write_text("{}")
    result = run_cli("train", "--warmup-steps", "100", "--steps", "40", "--out", str(held))
    assert result.returncode == 2 and "holds a run" in result.stderr
    assert (
        "warning: the warm-up (100 steps) is not shorter than the run (40 steps): the rate "
        "rises for the whole run and ends at 40% of lr; lower --warmup-steps" in result.stderr
    )
    train, _ = data()
    # in the caller's words: a keyword for tether.fit, not the command line's flag
    warned = pytest.warns(
        UserWarning, match=r"the warm-up \(60 steps\).*run \(30 steps\).*; lower warmup_steps$"
    )
    with warned, pytest.raises(TetherError, match="holds a run"):
        tether.fit(model=Tiny, train_data=train, steps=30, warmup_steps=60, out=held)


# -- tether launch and the examples ----------------------------------------------------------------
LOSING_SCRIPT = """
import os, signal, sys
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
import tether

ctx = tether.init()
torch.manual_seed(0)
net = nn.Linear(4, 2)
model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
for step in range(60):
    if ctx.rank == 2 and step == 10:
        os.kill(os.getpid(), signal.SIGKILL)  # this worker dies; the run goes on without it
    opt.zero_grad()
    F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
    opt.step()
print(f"worker rank {ctx.rank} finished", flush=True)
ctx.finish()
"""


def test_tether_launch_keeps_an_asynchronous_run_going_without_a_lost_worker(
    tmp_path: Path,
) -> None:
    result = _launch(tmp_path, LOSING_SCRIPT, 2, "async-easgd")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "worker rank 1 finished" in result.stdout
    assert "worker rank 2 finished" not in result.stdout
    lost = re.search(r"worker rank 2 lost .*SIGKILL.*\(details in (\S+)\)", result.stderr)
    assert lost, result.stderr[-2000:]
    # said once, by its supervisor as it happened (the server said it again at the end)
    assert "worker rank 2 was lost" not in result.stderr, result.stderr[-2000:]
    record = Path(lost.group(1))  # the record the message names is there after the run
    try:
        assert json.loads(record.read_text())["exit"] == "killed by SIGKILL"
    finally:
        shutil.rmtree(record.parent, ignore_errors=True)


SERVED_SCRIPT = """
import torch
import tether

ctx = tether.init(method="async-sgd")
net = torch.nn.Linear(4, 2)
model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
print("workers", ctx.workers, flush=True)
ctx.finish()
"""


def test_tether_launch_without_the_method_says_that_its_rank_0_serves(tmp_path: Path) -> None:
    # tether launch --workers 2 of an async-sgd script said "2 workers", and one trained
    script = tmp_path / "served.py"
    script.write_text(SERVED_SCRIPT)
    command = [sys.executable, "-m", "tether", "launch", "--workers", "2", str(script)]
    result = _run(command, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "workers 1" in result.stdout
    said = "async-sgd serves on rank 0, so of the 2 processes tether launch started without "
    assert said + "--method, 1 train: give it --method async-sgd" in result.stderr


STOPPING_SCRIPT = """
import os, signal, sys, time
import torch
import tether

ctx = tether.init(timeout_s=5)
net = torch.nn.Linear(4, 2)
model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
for step in range(400):
    if ctx.rank == 1 and step == 5:
        with open(sys.argv[1], "w") as mark:
            mark.write(str(time.time()))
        os.kill(os.getpid(), signal.SIGSTOP)  # this rank stops answering
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
ctx.finish()
"""


def test_tether_launch_ends_a_synchronous_run_whose_rank_stopped_and_names_it(
    tmp_path: Path,
) -> None:
    # Before, tether launch ran a synchronous method's ranks without the supervisor: a stopped
    # rank ended the run only after the timeout and the agent's 30 s, and was not named.
    mark = tmp_path / "stopped_at"
    result = _launch(tmp_path, STOPPING_SCRIPT, 2, "sync-sgd", str(mark))
    ended = time.time()
    assert result.returncode == 1, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(
        "tether: error: worker rank 1 was stopped (SIGSTOP) and stopped answering"
    ), error
    # the peer's 5 s timeout, then the supervisors' 3 s to end what a stop did not
    assert ended - float(mark.read_text()) < 15, ended - float(mark.read_text())


LEAVING_SCRIPT = """
import sys
import torch
import tether

ctx = tether.init()
net = torch.nn.Linear(4, 2)
model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
for step in range(20):
    if ctx.rank == 1 and step == 3:
        sys.exit(0)  # this rank leaves in the middle of the run, with status 0
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
ctx.finish()
"""


def test_tether_launch_names_a_synchronous_rank_that_left_without_finish(
    tmp_path: Path,
) -> None:
    # Before, the report blamed the healthy rank: "worker rank 0 failed: Connection closed by
    # peer"; rank 1's status 0 was a success to the launcher.
    result = _launch(tmp_path, LEAVING_SCRIPT, 2, "sync-sgd")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "tether: worker rank 1 ends without ctx.finish(): any peer still" in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(
        "tether: error: worker rank 1 left the run early: its script ended (exit status 0) "
        "without ctx.finish(); worker rank 0 failed"
    ), error


EARLY_FAILING_SCRIPT = """
import os
import tether

if os.environ["RANK"] == "2":
    raise RuntimeError("no data on this node")  # before the run has formed
ctx = tether.init()
ctx.finish()
"""


def test_a_worker_that_fails_before_joining_fails_an_asynchronous_run_at_once(
    tmp_path: Path,
) -> None:
    # Before, the supervisor tolerated its loss as any other: the others waited out the
    # rendezvous (60 s), were all recorded lost, and the server failed last, blaming a store
    # timeout.
    started = time.time()
    result = _launch(tmp_path, EARLY_FAILING_SCRIPT, 3, "async-sgd")
    took = time.time() - started
    assert result.returncode == 1, result.stderr[-3000:]
    assert "worker rank 2 failed before it joined the run" in result.stderr, result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("tether: error: worker rank 2 failed: exited with code 1"), error
    assert took < 30, took  # start-up and the agent's stop; no rendezvous timeout


# A user's loop whose server's serving thread hangs DELAY s into the run (a signal handler that
# sleeps, in the main thread, as a deadlock would), its workers training for STEPS steps (6000:
# 30 s or more)
HANGING_SERVER_TEMPLATE = """
import os, signal, sys, threading, time
import torch
import tether
{setup}
ctx = tether.init({init})
if ctx.rank == 0:
    signal.signal(signal.SIGUSR1, lambda *_: time.sleep(10**6))
    timer = threading.Timer({delay}, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.daemon = True  # a server done before it fires ends as it would
    timer.start()
net = torch.nn.Linear(4, 2)
model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.01))
for step in range({steps}):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    time.sleep(0.005)
print(f"worker rank {{ctx.rank}} finished", flush=True)
ctx.finish()
"""
HANGING_SERVER_SCRIPT = HANGING_SERVER_TEMPLATE.format(
    setup="", init="timeout_s=5", delay=3.0, steps=6000
)


@pytest.mark.slow
def test_a_hogwild_run_whose_server_hangs_ends_naming_it(tmp_path: Path) -> None:
    # Hogwild workers never wait for the server: before, they trained on and finished, and the
    # run waited for the hung server for ever. Now they give it up when its pulse on the board
    # stands still for the timeout, and the server, alone, is ended by its supervisor.
    result = _launch(tmp_path, HANGING_SERVER_SCRIPT, 3, "hogwild-sgd", timeout=150)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "pulse stood still" in result.stderr, result.stderr[-3000:]
    assert "finished" not in result.stdout  # they gave the server up long before their end
    assert "server rank 0 stopped answering" in result.stderr, result.stderr[-3000:]
    for lost in set(re.findall(r"details in (\S+)/rank-\d+\.json", result.stderr)):
        shutil.rmtree(lost, ignore_errors=True)  # the records tether launch keeps


THREADED_HANGING_SERVER_SCRIPT = HANGING_SERVER_TEMPLATE.format(
    # the server threads of a run across nodes, here on one node
    setup="from tether.methods.hogwild_easgd import HogwildEASGD\nHogwildEASGD.shared_memory = False",
    init='method="hogwild-easgd", timeout_s=5',
    delay=8.0,  # its start done (the workers' start-up on 2 busy cores takes seconds)
    steps=6000,
)


@pytest.mark.slow
def test_hogwild_easgds_threads_stop_answering_for_a_hung_serving_thread(tmp_path: Path) -> None:
    # Across nodes hogwild-easgd's server answers each worker on a thread of its own: with the
    # serving thread hung they answered on, the workers trained to their end, and torchrun
    # (no supervisor) waited for the server for ever. Now the threads stop answering once the
    # serving thread's pulse stands still for the timeout, and the workers give the server up;
    # by the same rule, at the same moment, the server ends itself (its own watch while it
    # serves): whichever comes first ends the run, naming the stillness.
    script = tmp_path / "script.py"
    script.write_text(THREADED_HANGING_SERVER_SCRIPT)
    result = _run([str(VENV_BIN / "torchrun"), "--nproc-per-node", "3", str(script)], timeout=100)
    assert result.returncode == 1, result.stderr[-3000:]
    threads_said = "serving thread stood still" in result.stderr
    server_said = "server rank 0 stopped answering while it served its workers" in result.stderr
    assert threads_said or server_said, result.stderr[-3000:]
    assert "finished" not in result.stdout


SAVING_SCRIPT = """
import os, signal, sys, time
import torch
import tether

def save_and_leave(*_):
    time.sleep(4)  # a checkpoint written on the way out
    open(sys.argv[1], "w").write("saved")
    sys.exit(143)

ctx = tether.init(timeout_s=30)
if ctx.rank == 0:
    signal.signal(signal.SIGTERM, save_and_leave)
net = torch.nn.Linear(4, 2)
model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
for step in range(100000):
    if ctx.rank == 1 and step == 5:
        raise RuntimeError("this rank fails")
    if ctx.rank == 0 and step == 5:
        time.sleep(60)  # at work between steps when the launcher stops it
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
"""


def test_tether_launch_gives_a_script_the_agents_time_to_save_on_sigterm(tmp_path: Path) -> None:
    # Under the supervisor a rank told to stop was killed 3 s later (tether train's workers
    # need no more); a user's script saving on SIGTERM, as under torchrun, gets torch's 30 s.
    saved = tmp_path / "saved"
    result = _launch(tmp_path, SAVING_SCRIPT, 2, "sync-sgd", str(saved))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "worker rank 1 failed: RuntimeError: this rank fails" in result.stderr
    assert saved.read_text() == "saved"


EARLY_SAMPLER_SCRIPT = """
import torch
import tether

ctx = tether.init()
data = torch.utils.data.TensorDataset(torch.randn(64, 4))
sampler = ctx.sampler(data, 8)  # DDP's habit, data first: the server has none to take
net = torch.nn.Linear(4, 2)
model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
ctx.finish()
"""


def test_tether_launch_names_a_failed_server_and_its_reason(tmp_path: Path) -> None:
    # Before: "worker rank 0 failed: exited with code 1": the server called a worker, and its
    # error ("the server rank trains on no data", which did not say what to do) only in the
    # traceback above.
    result = _launch(tmp_path, EARLY_SAMPLER_SCRIPT, 1, "async-sgd")
    assert result.returncode == 1, result.stderr[-3000:]
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.startswith(
        "tether: error: server rank 0 failed: TetherError: the server rank trains on no data: "
        "call ctx.sampler after ctx.wrap"
    ), summary
    assert "Traceback" not in result.stderr  # the one line, not a traceback of it per rank


@pytest.mark.slow
def test_example_tabular_classifier(tmp_path: Path) -> None:
    result = _run([sys.executable, str(EXAMPLES / "tabular_classifier.py"), "--out", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert accuracy >= 0.9, result.stdout  # the majority class is 63%
    again = float(re.search(r"recomputed here: ([0-9.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert again == pytest.approx(accuracy, abs=1e-3)  # the returned model is the evaluated one


@pytest.mark.slow
def test_example_regression(tmp_path: Path) -> None:
    result = _run([sys.executable, str(EXAMPLES / "regression.py"), "--out", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-3000:]
    match = re.search(
        r"mean absolute error ([0-9.]+) \(predicting the mean: ([0-9.]+)\)", result.stdout
    )
    assert match is not None, result.stdout
    assert float(match.group(1)) < 0.8 * float(match.group(2))


@pytest.mark.slow
@requires_fashion_mnist
def test_example_own_loop_under_torchrun() -> None:
    script = str(EXAMPLES / "fashion_mnist_loop.py")
    result = _run([str(VENV_BIN / "torchrun"), "--nproc-per-node", "2", script, "--steps", "200"])
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert accuracy >= 0.6, result.stdout  # ten classes: chance is 10%


@pytest.mark.slow
def test_example_parameter_server_loop() -> None:
    script = str(EXAMPLES / "parameter_server_loop.py")
    command = [
        sys.executable,
        "-m",
        "tether",
        "launch",
        "--workers",
        "2",
        "--method",
        "async-sgd",
        script,
    ]
    result = _run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    scores = [float(s) for s in re.findall(r"score ([0-9.]+)", result.stdout)]
    assert len(scores) == 2 and min(scores) >= 0.6, result.stdout


@pytest.mark.slow
def test_example_model_parallel_loop() -> None:
    """ctx.parallelize + ctx.wrap under tether launch: a 2 x 2 grid trains with sync-easgd, and
    the gathered state_dict loads into the unsharded model (the Context's path itself is checked
    faster in tests/distributed/test_model_parallel.py)."""
    script = str(EXAMPLES / "model_parallel_loop.py")
    result = _run([sys.executable, "-m", "tether", "launch", "--workers", "4", script])
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert accuracy >= 0.7, result.stdout  # ten classes: chance is 10%


def test_examples_are_the_ones_the_docs_name() -> None:
    # in the table of runnable examples, not only somewhere in the text (the model-parallel
    # one was missing from the table: found by a docs review)
    docs = (ROOT / "docs" / "api.md").read_text()
    table = {line.split("`")[1] for line in docs.splitlines() if line.startswith("| `examples/")}
    assert table == {f"examples/{example.name}" for example in EXAMPLES.glob("*.py")}


LONE_SCRIPT = """
import warnings

import torch
import tether

with warnings.catch_warnings(record=True) as heard:
    warnings.simplefilter("always")
    ctx = tether.init(method="local-sgd", tau=2, epochs=3, workers=4, momentum=0.5, lars_eta=0.01)
    net = torch.nn.Linear(3, 1)
    model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
for warning in heard:
    print("warned:", warning.message)
for _ in range(4):
    opt.zero_grad()
    model(torch.ones(2, 3)).pow(2).mean().backward()
    opt.step()
print("workers", ctx.workers, "weight", float(ctx.eval_model().weight.sum()))
ctx.finish()
try:
    ctx.eval_model()
except tether.TetherError as exc:
    print("after finish:", exc)
try:
    opt.step()
except tether.TetherError as exc:
    print("step after finish:", exc)
"""


def test_init_in_a_lone_process_needs_no_launcher(tmp_path: Path) -> None:
    script = tmp_path / "lone.py"
    script.write_text(LONE_SCRIPT)
    result = _run([sys.executable, str(script)], timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "workers 1 weight" in result.stdout
    assert "after finish: this run has finished" in result.stdout
    # a step after finish was torch's "call init_process_group"; settings no loop of one's own
    # reads were taken without a word
    assert "step after finish: optimizer.step() after ctx.finish()" in result.stdout
    assert "warned: tether.init ignores epochs: your own loop decides" in result.stdout
    assert "warned: tether.init ignores workers=4: the launcher started 1" in result.stdout
    # as tether.fit says it: a momentum given to init that the user's own optimizer ignores
    assert "warned: momentum has no effect: your own optimizer sets its own" in result.stdout
    # it said "applies to optimizer='lars' only", which tether.init refuses
    said = "warned: tether.init ignores lars_eta: set it on the optimizer you pass to ctx.wrap"
    assert said in result.stdout and "optimizer='lars'" not in result.stdout
    assert result.stdout.count("lars_eta") == 1  # not again when ctx.wrap took an optimizer


AGAIN_SCRIPT = """
import torch
import tether

ctx = tether.init(method="local-sgd")
mixed = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1).double())
try:
    ctx.wrap(mixed)
except tether.TetherError as exc:
    print("wrap:", exc)
try:
    tether.init(method="local-sgd")
except tether.TetherError as exc:
    print("init again:", exc)
model, opt = ctx.wrap(mixed.float())  # the same context, the model fixed
opt.zero_grad()
model(torch.ones(2, 3)).sum().backward()
opt.step()
ctx.finish()
ctx = tether.init(method="sync-sgd")  # the first run finished: a new one starts
ctx.finish()  # never wrapped: only its process group ends
ctx = tether.init(method="sync-sgd")
print("third run:", ctx)
ctx.finish()
"""


def test_a_mixed_dtype_model_and_a_second_init_are_refused_in_one_line(tmp_path: Path) -> None:
    # Before: a bare AssertionError from the flat buffer, then torch's "trying to initialize
    # the default process group twice!" for an init after it, with no way out named.
    script = tmp_path / "again.py"
    script.write_text(AGAIN_SCRIPT)
    result = _run([sys.executable, str(script)], timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert lines["wrap"].startswith("local-sgd packs the model's parameters into one flat buffer")
    assert (
        "float32 on cpu (0.weight, 0.bias) and float64 on cpu (1.weight, 1.bias)" in (lines["wrap"])
    )
    assert lines["init again"].startswith("this process is still in a run")
    assert "ctx.finish()" in lines["init again"]
    assert lines["third run"] == "Context(sync-sgd, rank 0/1, worker 0 of 1)"


CLIP_SCRIPT = """
import torch
import tether

def one_step(optimizer_of):
    ctx = tether.init(method="sync-sgd")
    net = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.zeros_(net.weight)
    model, opt = ctx.wrap(net, optimizer_of(net))
    opt.zero_grad()
    (1000 * model(torch.ones(1, 3)).sum()).backward()  # a gradient of norm 1000 * sqrt(3)
    opt.step()
    clip, step = ctx.config.clip_grad_norm, float(net.weight.detach().norm())
    ctx.finish()
    return clip, step

print("own", *one_step(lambda net: torch.optim.SGD(net.parameters(), lr=0.001)))
print("default", *one_step(lambda net: None))
"""


def test_init_clips_with_the_methods_own_rate_but_not_a_users_optimizer(tmp_path: Path) -> None:
    # sync-sgd's defaults clip the gradient's norm at 2 to keep their doubled rate stable; a
    # DDP loop moved to ctx.wrap with its own optimizer must train as it did: unclipped.
    script = tmp_path / "clip.py"
    script.write_text(CLIP_SCRIPT)
    result = _run([sys.executable, str(script)], timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    clip, step = lines["own"].split()
    unclipped = 0.001 * 1000 * 3**0.5  # the user's lr on the whole gradient
    assert clip == "None" and float(step) == pytest.approx(unclipped, rel=1e-5)
    clip, step = lines["default"].split()
    # the method's own step: lr 0.025 (1 worker x 64 of 256 x 0.1) on the gradient clipped at 2
    assert float(clip) == 2.0 and float(step) == pytest.approx(0.025 * 2, rel=1e-5)


class TinyNormed(nn.Module):
    """Inputs far from mean 0 and variance 1: evaluated with batch norm's initial statistics,
    its hidden layer would be normalised wrongly."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.norm = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.norm(self.fc(x))))


def test_a_center_and_a_servers_weights_get_their_own_batch_norm_statistics(tmp_path: Path) -> None:
    # Nothing trains the EASGD center's (or a server's) running statistics by forward passes:
    # they stayed at mean 0 / variance 1 and LeNet-5 with batch norm scored 45% where it should
    # score 87%. Now they are recomputed, before each evaluation, from the evaluated model's own
    # activations on a sample of the training set (tether.training.norm_stats).
    train, test = data()
    shifted = TensorDataset(train.tensors[0] * 4 + 10, train.tensors[1])
    for method in ("sync-easgd", "async-sgd"):
        result = tether.fit(
            model=TinyNormed,
            train_data=shifted,
            eval_data=TensorDataset(test.tensors[0] * 4 + 10, test.tensors[1]),
            method=method,
            workers=2,
            batch_size=8,
            steps=12,
            out=tmp_path / method,
        )
        model = result.model
        order = calibration_subset(shifted, seed=0).indices  # the whole set, seeded order
        with torch.no_grad():
            hidden = model.fc(shifted.tensors[0][order])
        batches = hidden.split(8)  # the run's batch size: a cumulative average over its batches
        mean = torch.stack([b.mean(0) for b in batches]).mean(0)
        var = torch.stack([b.var(0, unbiased=True) for b in batches]).mean(0)
        assert torch.allclose(model.norm.running_mean, mean, rtol=1e-4, atol=1e-4), method
        assert torch.allclose(model.norm.running_var, var, rtol=1e-4, atol=1e-4), method
