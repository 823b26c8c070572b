"""Asynchronous methods survive a lost worker: the run completes and records the loss.

End to end through `tether train` (torch's elastic agent, one supervisor per worker slot, real
faults injected into rank 2), plus the supervisor's own decisions on tiny child programs.

Two workers (ranks 1 and 2) and the server: rank 2 is lost, rank 1 carries on. (A third worker
cost each run up to 6 s more on a 2-core machine: 4 processes and their supervisors.) The
healthy run longer than --timeout is in tests/entry/test_listeners.py, which also reads where
its processes listen.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import processes_mentioning, requires_fashion_mnist, run_cli

# lr below the method's tuned 0.4 (chosen at batch 64, 4 workers): at batch 32 with 3 workers an
# unlucky arrival order diverged once in CI (test accuracy 0.1); these tests are about lost
# workers, not about that default (see the issue note).
ASYNC = [
    "--method",
    "async-easgd",
    "--workers",
    "2",
    "--batch-size",
    "32",
    "--lr",
    "0.2",
    "--no-progress",
]
STEPS = 150
FAULT = ["--set", "fault_rank=2", "--set", "fault_step=20"]


def _lost_run(run: Path, kind: str, timeout: str = "20") -> tuple[dict, str, str, float]:
    args = [*ASYNC, "--steps", str(STEPS), "--eval-every", "50", "--timeout", timeout]
    result = run_cli("train", *args, *FAULT, "--set", f"fault_kind={kind}", "--out", str(run))
    assert result.returncode == 0, result.stderr[-3000:]
    assert processes_mentioning(str(run)) == []  # every worker and supervisor is gone
    summary = json.loads((run / "summary.json").read_text())
    # The server carried on with rank 1: it stopped when it finished its steps.
    assert [w["rank"] for w in summary["lost_workers"]] == [2]
    assert 20 < summary["steps"] <= STEPS
    assert summary["history"][-1]["step"] == summary["steps"]
    assert summary["final_test_accuracy"] > 0.3  # chance is 0.1
    assert "lost workers" in result.stdout and "rank 2" in result.stdout
    record = json.loads((run / "lost" / "rank-2.json").read_text())
    assert record["rank"] == 2
    return summary["lost_workers"][0], result.stdout, result.stderr, result.seconds


@requires_fashion_mnist
def test_killed_worker_is_recorded_and_the_run_completes(tmp_path: Path) -> None:
    lost, stdout, stderr, seconds = _lost_run(tmp_path / "run", "kill")
    assert lost["reason"] == "killed by SIGKILL" and lost["exit"] == "killed by SIGKILL"
    assert "rank 2 (channel 1) closed its connection" in lost["server_reason"]  # its watch saw it
    assert "rank 2 at " in stdout and "(killed by SIGKILL)" in stdout
    assert "worker rank 2 lost (killed by SIGKILL)" in stderr
    assert seconds < 60, seconds


@requires_fashion_mnist
def test_worker_exception_is_a_lost_worker_with_its_traceback_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    lost, stdout, stderr, seconds = _lost_run(run, "raise")
    assert lost["reason"] == "RuntimeError: injected fault at step 20"
    assert lost["exit"] == "exited with code 1"
    assert "RuntimeError: injected fault at step 20" in stdout
    assert "Traceback" not in stderr  # one line on the console; the traceback is kept
    for kept in (run / "failures.log", run / "lost" / "rank-2.json"):
        text = kept.read_text()
        assert "Traceback" in text and "maybe_inject_fault" in text, kept
    assert seconds < 60, seconds


# Slow: the server's giving up on a silent worker ("sent nothing") is checked on the endpoint
# async-easgd serves with (tests/distributed/test_server_fuzz.py), and end to end a hung
# async-easgd worker given up and killed, the run completing, by the stalled-worker test below
# (hang-after-send); this run adds the "hang" fault's reason.
@pytest.mark.slow
@requires_fashion_mnist
def test_hung_worker_is_given_up_and_stopped(tmp_path: Path) -> None:
    # Rank 2 stops sending at step 20: after --timeout seconds of silence the server goes on
    # without it, and its process is killed once the server has finished.
    lost, _, _, seconds = _lost_run(tmp_path / "run", "hang", timeout="5")
    assert "hung" in lost["reason"] and lost["exit"].startswith("killed")
    assert seconds < 60, seconds


@requires_fashion_mnist
@pytest.mark.parametrize(
    "method, kind",
    [("async-easgd", "hang-after-send"), ("async-sgd", "stop"), ("hogwild-sgd", "hang")],
)
def test_stalled_worker_costs_the_server_only_that_worker(
    tmp_path: Path, method: str, kind: str
) -> None:
    # async-easgd: rank 2 sends its message and never reads the reply (as a SIGSTOP between the
    # two catches it): the reply to it must not block the server, which lost every worker before.
    # async-sgd: rank 2 stops itself with SIGSTOP. hogwild-sgd: rank 2 hangs; the server sees its
    # step count stand still (it hung the run for ever before).
    run = tmp_path / "run"
    args = [*ASYNC, "--method", method, "--steps", str(STEPS), "--eval-every", "50"]
    fault = [*FAULT, "--set", f"fault_kind={kind}"]
    result = run_cli("train", *args, "--timeout", "5", *fault, "--out", str(run), timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert [w["rank"] for w in summary["lost_workers"]] == [2], summary["lost_workers"]
    assert summary["lost_workers"][0]["exit"].startswith("killed")
    # Rank 1 did its whole budget: STEPS, rank 2 about 20.
    assert summary["steps"] >= (STEPS + 20) // 2 - 1, summary["steps"]
    assert processes_mentioning(str(run)) == []
    assert result.seconds < 60, result.seconds


@requires_fashion_mnist
def test_run_that_lost_every_worker_fails(tmp_path: Path) -> None:
    # One worker, killed: the server is left alone at step 20 of 150. It used to exit 0.
    run = tmp_path / "run"
    args = [*ASYNC, "--workers", "1", "--steps", str(STEPS), "--eval-every", "50"]
    fault = ["--set", "fault_rank=1", "--set", "fault_step=20", "--set", "fault_kind=kill"]
    result = run_cli("train", *args, "--timeout", "10", *fault, "--out", str(run))
    assert result.returncode != 0
    assert "every worker was lost" in result.stderr and "rank 1" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    summary = json.loads((run / "summary.json").read_text())  # what was done is kept
    assert summary["steps"] < STEPS
    # ... marked failed: it looked like a finished run (samples/s 0, no failure)
    assert summary["status"] == "failed" and "every worker was lost" in summary["error"]


# -- the supervisor on its own: tiny child programs, no torch ------------------------------------
def _supervise(
    tmp_path: Path, rank: int, code: str, lost: bool = True, marks: bool = False
) -> subprocess.CompletedProcess[str]:
    """The supervisor running ``code`` as rank ``rank``'s child, with ``tmp_path/lost`` (a run
    that tolerates a lost worker) and ``tmp_path/marks`` where asked."""
    env = {**os.environ, "RANK": str(rank), "TORCHELASTIC_ERROR_FILE": str(tmp_path / "err.json")}
    cmd = [sys.executable, "-m", "tether.launch.supervise"]
    cmd += ["--lost-dir", str(tmp_path / "lost")] if lost else []
    cmd += ["--marks-dir", str(tmp_path / "marks")] if marks else []
    cmd += ["--", sys.executable, "-c", code]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)


def _started(supervisor_options: list[str], code: str, started: Path) -> subprocess.Popen[bytes]:
    """The supervisor (rank 1) running ``code``, once its child has touched ``started``."""
    cmd = [sys.executable, "-m", "tether.launch.supervise", *supervisor_options]
    proc = subprocess.Popen(
        [*cmd, "--", sys.executable, "-c", code], env={**os.environ, "RANK": "1"}
    )
    for _ in range(200):
        if started.exists():
            break
        time.sleep(0.05)
    return proc


JOIN = "import os, pathlib; pathlib.Path(os.environ['TETHER_JOINED_MARK']).touch(); "


def test_supervisor_hides_a_worker_failure_and_records_it(tmp_path: Path) -> None:
    error = {"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "TB"}}}
    code = f"import json; json.dump({error!r}, open({str(tmp_path / 'err.json')!r}, 'w')); exit(3)"
    proc = _supervise(tmp_path, 1, JOIN + code)  # the worker had joined the run
    assert proc.returncode == 0
    record = json.loads((tmp_path / "lost" / "rank-1.json").read_text())
    assert record["reason"] == "ValueError: boom" and record["traceback"] == "TB"
    assert record["exit"] == "exited with code 3"


def test_supervisor_passes_on_a_worker_failure_before_it_joined(tmp_path: Path) -> None:
    # The run cannot form without it: tolerated, its loss left the others at the rendezvous.
    proc = _supervise(tmp_path, 1, "exit(3)")
    assert proc.returncode == 3
    assert "worker rank 1 failed before it joined the run" in proc.stderr
    assert list((tmp_path / "lost").glob("rank-*.json")) == []


@pytest.mark.parametrize("rank, lost", [(0, True), (1, False)])
def test_supervisor_passes_on_other_failures(tmp_path: Path, rank: int, lost: bool) -> None:
    # The server's failure (or any failure without --lost-dir) ends the run as before: same
    # exit code, and a child killed by a signal makes the supervisor die by the same signal.
    assert _supervise(tmp_path, rank, "exit(3)", lost).returncode == 3
    killed = _supervise(tmp_path, rank, "import os; os.kill(os.getpid(), 9)", lost)
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "lost" / f"rank-{rank}.json").exists()


def test_a_stopped_server_whose_workers_are_all_lost_fails_the_run(tmp_path: Path) -> None:
    # The server (rank 0 of 3) stopped (SIGSTOP): both workers timed out on it and were recorded
    # lost, "the run carries on". Nothing watched the server, and the run waited forever.
    (tmp_path / "lost").mkdir()
    for rank in (1, 2):
        (tmp_path / "lost" / f"rank-{rank}.json").write_text(json.dumps({"rank": rank}))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "3"}
    cmd = [sys.executable, "-m", "tether.launch.supervise", "--lost-dir", str(tmp_path / "lost")]
    code = "import os, signal, time; os.kill(os.getpid(), signal.SIGSTOP); time.sleep(60)"
    started = time.monotonic()
    proc = subprocess.run(
        [*cmd, "--", sys.executable, "-c", code], env=env, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1 and time.monotonic() - started < 10
    assert "server rank 0 was stopped (SIGSTOP) and every worker lost its link" in proc.stderr
    assert processes_mentioning("os.kill(os.getpid(), signal.SIGSTOP)") == []


def test_supervisor_forwards_sigterm_and_records_no_loss(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    code = f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"
    proc = _started(["--lost-dir", str(tmp_path / "lost")], code, marker)
    try:
        assert marker.exists()
        proc.send_signal(signal.SIGTERM)
        # The child died of the forwarded SIGTERM, and so does the supervisor: a stop, not a loss.
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
    assert list((tmp_path / "lost").glob("rank-*.json")) == []
    assert processes_mentioning(str(marker)) == []


def test_supervisor_kills_a_worker_the_finished_server_gave_up_at_once(tmp_path: Path) -> None:
    # The server finished and its summary names rank 2 as given up (hung or stopped): nothing
    # waits for it, so its supervisor kills it at the next poll instead of GRACE_S later.
    from tether.launch.lost import SERVER_FINISHED
    from tether.launch.supervise import GRACE_S

    (tmp_path / "lost").mkdir()
    (tmp_path / "lost" / SERVER_FINISHED).touch()
    summary = {"lost_workers": [{"rank": 2, "reason": "sent nothing for 5.0 s"}]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    started = time.monotonic()
    proc = _supervise(tmp_path, 2, "import time; time.sleep(60)")
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "lost" / "rank-2.json").read_text())
    assert record["reason"] == "killed: given up by the server, still running when it finished"
    assert record["overstayed"] and record["exit"] == "killed by SIGKILL"
    assert took < GRACE_S - 1, took


# The server's side of its pulse (tether.observe.pulse_mark): started with a 1 s timeout, beats
# for `beats` x 0.3 s (longer than the timeout), then hangs or ends.
PULSING_SERVER = (
    "import sys, time; from tether.observe.pulse_mark import beat, start_pulse; start_pulse(1)\n"
    "for _ in range({beats}): time.sleep(0.3); beat()\n"
    "time.sleep(60) if sys.argv[1] == 'hang' else None"
)


@pytest.mark.parametrize("ending", ["hang", "end"])
def test_the_server_is_watched_by_its_pulse_once_every_worker_finished(
    tmp_path: Path, ending: str
) -> None:
    # Before, a server hung once its workers had finished (in its final evaluation, its save)
    # kept the run waiting for ever; one that keeps beating past its timeout is at work.
    lost, marks = tmp_path / "lost", tmp_path / "marks"
    lost.mkdir()
    marks.mkdir()
    (marks / "finished-rank-1").touch()
    (lost / "rank-2.json").write_text(json.dumps({"rank": 2}))  # one finished, one lost
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "3"}
    cmd = [sys.executable, "-m", "tether.launch.supervise", "--lost-dir", str(lost)]
    cmd += ["--marks-dir", str(marks), "--", sys.executable, "-c"]
    started = time.monotonic()
    proc = subprocess.run(
        [*cmd, PULSING_SERVER.format(beats=8), ending], env=env, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    took = time.monotonic() - started
    if ending == "end":
        assert proc.returncode == 0, proc.stderr
        assert not (marks / "cause-rank-0").exists()
        return
    assert proc.returncode == 1 and took < 10, (proc.returncode, took)
    why = (marks / "cause-rank-0").read_text()
    assert why.startswith("stopped answering after every worker had finished"), why
    assert "(--timeout 1 s)" in why and why in proc.stderr


def test_the_supervisor_starts_without_torch() -> None:
    # It runs every rank: importing torch there would cost each rank seconds before its child
    code = "import sys, tether.launch.supervise; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_a_sigterm_from_outside_is_marked_as_the_cause(tmp_path: Path) -> None:
    # The agent reported it as "killed by SIGTERM", which is how it reports its own stop of the
    # healthy ranks after a failure: the report listed the rank among the consequences.
    marks = tmp_path / "marks"
    cmd = [sys.executable, "-m", "tether.launch.supervise", "--marks-dir", str(marks), "--"]
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    env = {**os.environ, "RANK": "1"}
    proc = subprocess.run([*cmd, sys.executable, "-c", code], env=env, timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert (
        marks / "cause-rank-1"
    ).read_text() == "failed: killed by SIGTERM, sent from outside the run"


# A worker of a user's own loop that ends without ctx.finish() writes the file TETHER_LEFT_MARK
# names (tether.observe.left_mark); these children stand in for one.
LEAVE = "import os, pathlib; pathlib.Path(os.environ['TETHER_LEFT_MARK']).write_text(str(os.getpid())); "


def test_a_worker_that_exits_0_before_finish_is_named_as_the_cause(tmp_path: Path) -> None:
    # A synchronous run's rank that ended with status 0 mid-run was a success to the launcher;
    # its peers' "connection closed by peer" was reported as the run's cause.
    proc = _supervise(tmp_path, 1, LEAVE + "exit(0)", lost=False, marks=True)
    assert proc.returncode == 0  # its peers may not need it (a ctx.finish() forgotten at the end)
    cause = (tmp_path / "marks" / "cause-rank-1").read_text()
    assert cause == "left the run early: its script ended (exit status 0) without ctx.finish()"


def test_a_worker_that_exits_0_before_finish_is_lost_to_an_asynchronous_run(
    tmp_path: Path,
) -> None:
    proc = _supervise(tmp_path, 1, JOIN + LEAVE + "exit(0)", lost=True, marks=True)
    assert proc.returncode == 0
    record = json.loads((tmp_path / "lost" / "rank-1.json").read_text())
    assert record["reason"].startswith("left the run early") and record["returncode"] == 0
    assert "worker rank 1 lost (left the run early" in proc.stderr


def test_a_process_the_worker_started_does_not_speak_for_it(tmp_path: Path) -> None:
    # it inherits TETHER_LEFT_MARK: a script it runs that leaves its own run without
    # ctx.finish() marked its healthy parent as gone
    child = "import os, pathlib; pathlib.Path(os.environ['TETHER_LEFT_MARK']).write_text('1')"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    proc = _supervise(tmp_path, 1, code, lost=False, marks=True)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "marks" / "cause-rank-1").exists()


@pytest.mark.parametrize("lost", [False, True])
def test_a_worker_that_finished_is_not_said_to_have_left(tmp_path: Path, lost: bool) -> None:
    joined = JOIN if lost else ""  # a synchronous run's supervisor names no joined mark
    proc = _supervise(tmp_path, 1, joined + "exit(0)", lost, marks=True)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "marks" / "cause-rank-1").exists()
    assert not list((tmp_path / "lost").glob("rank-*.json"))
    assert (tmp_path / "marks" / "finished-rank-1").exists()


def test_a_worker_that_leaves_on_the_launchers_stop_did_not_leave_early(tmp_path: Path) -> None:
    # A script may save and exit 0 on the SIGTERM of a stopped run, without ctx.finish().
    started = tmp_path / "started"
    code = (
        "import os, pathlib, signal, sys, time\n"
        "def leave(*_):\n"
        "    pathlib.Path(os.environ['TETHER_LEFT_MARK']).write_text(str(os.getpid()))\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, leave)\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(60)\n"
    )
    proc = _started(["--marks-dir", str(tmp_path)], code, started)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    assert (tmp_path / "left-rank-1").exists() and not (tmp_path / "cause-rank-1").exists()
