"""A tiny supervisor between torch's elastic agent and one worker process.

The elastic agent stops every worker as soon as one of its processes fails. That is right for
synchronous methods, but an asynchronous parameter server can carry on without a dead worker
(methods with ``tolerates_worker_loss``). For those, the local launcher starts this module in each
of the agent's worker slots; it runs the real worker as its child and, when a worker rank other
than the server (rank 0) fails after it joined the run (:mod:`tether.observe.joined`), writes
``LOST_DIR/rank-R.json`` and exits 0, so the agent keeps the others running. Any other failure
(one before the worker joined included: the run cannot form without it) is passed on with the
child's exit status, and the child's
error file (:mod:`tether.launch.error_file`; the child inherits the agent's
TORCHELASTIC_ERROR_FILE) still reaches the agent.

A server still running once every worker is recorded lost (stopped, or hung ``SERVER_GRACE_S``
later: a healthy one ends the run itself) is killed and the run fails naming it: nothing else
would end it. So is a server whose pulse (:mod:`tether.observe.pulse_mark`, a file in MARKS_DIR)
stands still for its ``--timeout`` once every worker is done, at least one finished (a worker's
supervisor leaves a mark in MARKS_DIR when it exits 0): nobody else watches it then, in its final
evaluation and save (every server method: original-easgd, which tolerates no loss, too).
When the server exits 0 its supervisor leaves a mark in LOST_DIR; a worker still running
``GRACE_S`` later (hung: the server has given up on it) is killed and recorded as lost, so the agent
does not wait for it forever. A worker the server's ``summary.json`` names as given up is killed
at once: it is hung or stopped, and the run would only wait for it. Stop signals from the agent
are forwarded to the child; the child gets SIGKILL if the supervisor dies, and the supervisor
SIGTERM if the agent dies (Linux), so no worker outlives its launcher.

Every local run's workers (synchronous methods too) run under it, for the way a run stops: the
agent's SIGTERM cannot stop a process that is itself stopped (SIGSTOP) or blocked in a
collective, and the agent then waits 30 s before it kills. The supervisor forwards the signal
with a SIGCONT, and kills a child still alive ``STOP_GRACE_S`` later (a user's script under
``tether launch``: ``SCRIPT_STOP_GRACE_S``, torch's agent's own, time to save on SIGTERM).
With ``--marks-dir`` it also records a child that was stopped or still running when the run
was stopped (``stopped-rank-R``, ``running-rank-R``): the launcher names those ranks, the ones
that stopped answering, before the ranks that gave up waiting for them.

Standard library only, no torch: it must start fast and stay small.
    python -m tether.launch.supervise [--lost-dir DIR] [--marks-dir DIR] [--stop-grace S]
        -- COMMAND [ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from tether.launch.env import DistEnv, elastic_error_file
from tether.launch.error_file import read_error_file
from tether.launch.lost import (
    CAUSE_MARK,
    LOSSES_SAID_ENV,
    SERVER_FINISHED,
    given_up_by_server,
    lost_record,
    write_lost_record,
)
from tether.launch.parent_death import die_with_parent, exit_with_parent
from tether.observe.joined import JOINED_MARK_ENV
from tether.observe.left_mark import LEFT_EARLY, LEFT_MARK_ENV, has_left
from tether.observe.pulse_mark import PULSE_MARK_ENV, read_pulse

SERVER_RANK = 0
POLL_S = 0.5  # how often a tolerated worker's supervisor checks whether the server finished
GRACE_S = 5.0  # how long a worker may outlive a finished server before it is killed
STOP_GRACE_S = 3.0  # how long a child may take to end after a forwarded stop signal
# a user's script (tether launch) gets what torch's agent gives (it may save on SIGTERM)
SCRIPT_STOP_GRACE_S = 30.0
# how long a server may run on once every worker is lost (it then ends the run itself, failed,
# after writing what it has; still running later, it is hung)
SERVER_GRACE_S = 30.0
# In the marks directory: a worker's supervisor's, its child exited 0; the server's pulse
FINISHED_MARK = "finished-rank-"  # + R
LEFT_MARK = "left-rank-"  # + R: a worker in a user's loop left without ctx.finish()
SERVER_PULSE = "server-pulse"  # tether.observe.pulse_mark
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def process_state(pid: int) -> str:
    """The state letter of ``/proc/PID/stat`` (R running, S sleeping, T stopped...); "" if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class Supervisor:
    """Runs one worker; see the module docstring. ``lost_dir`` None: pass every failure on."""

    def __init__(
        self,
        command: list[str],
        lost_dir: Path | None,
        rank: int,
        marks_dir: Path | None = None,
        world_size: int = 1,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.command = command
        self.stop_grace_s = stop_grace_s
        self.lost_dir = lost_dir
        self.marks_dir = marks_dir
        self.rank = rank
        self.world_size = world_size
        self.stop_signal: int | None = None
        self.left_before_stop = False  # the child had left its run when a stop came
        self.stop_deadline: float | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self._workers_done_at: float | None = None  # when the server's supervisor saw it

    @property
    def tolerated(self) -> bool:
        """Whether this slot's worker may be lost without ending the run."""
        return self.lost_dir is not None and self.rank != SERVER_RANK

    @property
    def _joined_mark(self) -> Path:
        """The file the worker touches once it has joined the run (:mod:`tether.observe.joined`):
        until then its loss is not tolerated."""
        assert self.lost_dir is not None
        return self.lost_dir / f".joined-rank-{self.rank}"

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        del frame
        first = self.stop_signal is None
        self.stop_signal = signum
        if first:
            # (the child may be gone already: its peers failed when it left)
            self.left_before_stop = self._has_left()
        if self.child is not None and self.child.poll() is None:
            if first:
                self._mark(self.child.pid)
            self.child.send_signal(signum)
            # A stopped child handles the signal only once continued.
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signal.SIGCONT)
            if self.stop_deadline is None:
                self.stop_deadline = time.monotonic() + self.stop_grace_s

    def _mark(self, pid: int) -> None:
        """Record that the child was still at work, or stopped, when the run was stopped."""
        state = "stopped" if process_state(pid) in ("T", "t") else "running"
        self._write_mark(f"{state}-rank-{self.rank}")

    def _mark_cause(self, why: str) -> None:
        """Record why the child ended, for the launcher's report to say first."""
        self._write_mark(f"{CAUSE_MARK}{self.rank}", why)

    def _write_mark(self, name: str, text: str = "") -> None:
        """A file in the marks directory (nothing without one; a failure to write it must not
        change how the child's end is reported)."""
        if self.marks_dir is None:
            return
        with contextlib.suppress(OSError):
            self.marks_dir.mkdir(parents=True, exist_ok=True)
            (self.marks_dir / name).write_text(text)

    def run(self) -> int:
        for sig in FORWARDED:
            signal.signal(sig, self._forward)
        # If the agent dies we get SIGTERM, which stops the child like any other stop request.
        if not exit_with_parent(signal.SIGTERM):
            return 128 + signal.SIGTERM
        # Same environment (placement, error file). Its own process group, so a signal the agent
        # sends to our group reaches the child once, through us, not twice.
        env = dict(os.environ)
        if self.tolerated:
            assert self.lost_dir is not None
            self.lost_dir.mkdir(parents=True, exist_ok=True)
            env[JOINED_MARK_ENV] = str(self._joined_mark)
        if self.marks_dir is not None and self.rank == SERVER_RANK:
            # a parameter server beats there (a method without one: nothing is written)
            self.marks_dir.mkdir(parents=True, exist_ok=True)
            env[PULSE_MARK_ENV] = str(self.marks_dir / SERVER_PULSE)
        if self.marks_dir is not None:
            self.marks_dir.mkdir(parents=True, exist_ok=True)
            env[LEFT_MARK_ENV] = str(self._left_mark)
        if self.lost_dir is not None and self.rank == SERVER_RANK:
            env[LOSSES_SAID_ENV] = str(self.lost_dir)  # where its workers' are recorded
        self.child = subprocess.Popen(
            self.command, env=env, preexec_fn=die_with_parent(), process_group=0
        )
        if self.stop_signal is not None:  # it arrived while the child was starting
            self.child.send_signal(self.stop_signal)
        returncode, overstayed = self._wait(self.child)
        if self._left_early(returncode):
            if self.tolerated:
                return self._lost(returncode, "", LEFT_EARLY)
            # for the report, should its peers fail for want of it (they may not: one that
            # forgot ctx.finish() after its last step of sync-sgd costs them nothing)
            self._mark_cause(LEFT_EARLY)
            returncode = 0  # its own status (a stop since may have ended it on its way out)
        if returncode == 0:
            if self.lost_dir is not None and self.rank == SERVER_RANK:
                self.lost_dir.mkdir(parents=True, exist_ok=True)
                (self.lost_dir / SERVER_FINISHED).touch()
            if self.rank != SERVER_RANK:
                self._write_mark(f"{FINISHED_MARK}{self.rank}")
            return 0
        if self.stop_signal is None and self.tolerated:
            return self._lost(returncode, overstayed)
        return self._pass_on(returncode)

    @property
    def _left_mark(self) -> Path:
        """The file a worker in a user's own loop writes when it leaves its run without
        ctx.finish() (:mod:`tether.observe.left_mark`)."""
        assert self.marks_dir is not None
        return self.marks_dir / f"{LEFT_MARK}{self.rank}"

    def _has_left(self) -> bool:
        if self.marks_dir is None or self.child is None:
            return False
        return has_left(self._left_mark, self.child.pid)

    def _left_early(self, returncode: int) -> bool:
        """Whether the child, a worker in a user's own loop, left its run without ctx.finish()
        of its own accord, exiting 0: not in answer to a stop the launcher sent (a script may
        save and exit then), though the launcher may stop it since (its peers failed)."""
        if self.stop_signal is not None:  # a stop (or a kill after it) may have ended it since
            return self.left_before_stop and returncode <= 0
        return returncode == 0 and self._has_left()

    def _lost(self, returncode: int, overstayed: str, why: str = "") -> int:
        """A tolerated worker failed (or ``why``: left its part of the run early): recorded as
        lost (exit 0, the run carries on) once it had joined the run (or we killed it for
        outliving the server); before, passed on."""
        assert self.lost_dir is not None
        if not overstayed and not self._joined_mark.exists():
            print(
                f"tether: worker rank {self.rank} failed before it joined the run, which cannot "
                "form without it; the run fails",
                file=sys.stderr,
                flush=True,
            )
            return self._pass_on(returncode)
        error = read_error_file(elastic_error_file())
        record = lost_record(self.rank, returncode, error)
        if overstayed:
            record["overstayed"] = True
            record["reason"] = f"killed: {overstayed}"
        elif why:
            record["reason"] = why
        path = write_lost_record(self.lost_dir, record)
        after = "" if overstayed else "; the run carries on without it"
        print(
            f"tether: worker rank {self.rank} lost ({record['reason']}){after} (details in {path})",
            file=sys.stderr,
            flush=True,
        )
        return 0

    def _pass_on(self, returncode: int) -> int:
        """End as the child ended, for the agent to report."""
        if returncode == -signal.SIGTERM and self.stop_signal is None:
            # not the launcher's stop (it goes through us): the agent's report could not tell
            self._mark_cause("failed: killed by SIGTERM, sent from outside the run")
        if returncode < 0:
            # Die the way the child died, so the agent reports "killed by SIGKILL", not 137.
            with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
                signal.signal(-returncode, signal.SIG_DFL)
            os.kill(os.getpid(), -returncode)
            return 128 - returncode
        return returncode

    def _abandoned_server(self, pid: int) -> str:
        """Why the server (this slot's child) is to be killed, or "": every worker has been
        recorded lost and the server, which would then end the run itself, is stopped, or still
        running ``SERVER_GRACE_S`` after the last loss (hung). Its workers, tolerated losses
        each, have gone; nothing else would end it, and the agent would wait forever."""
        assert self.lost_dir is not None
        lost = list(self.lost_dir.glob("rank-*.json"))
        if len(lost) < max(1, self.world_size - 1):
            return ""
        if process_state(pid) in ("T", "t"):
            return "was stopped (SIGSTOP) and every worker lost its link to it"
        last = max(path.stat().st_mtime for path in lost)
        if time.time() - last > SERVER_GRACE_S:
            return (
                f"stopped answering: every worker lost its link to it, and it was still running "
                f"{SERVER_GRACE_S:.0f} s later"
            )
        return ""

    def _hung_at_the_end(self, pid: int) -> str:
        """Why the server is to be killed, or "": every worker is done (finished, at least one,
        or lost) and nobody watches the server any more; its pulse
        (:mod:`tether.observe.pulse_mark`: its final evaluation's batches, its save) has stood
        still for its ``--timeout`` since then. A server still serving a live worker is that
        worker's to watch."""
        if self.marks_dir is None:
            return ""
        finished = len(list(self.marks_dir.glob(f"{FINISHED_MARK}*")))
        lost = len(list(self.lost_dir.glob("rank-*.json"))) if self.lost_dir is not None else 0
        if not finished or finished + lost < self.world_size - 1:
            return ""
        if self._workers_done_at is None:
            self._workers_done_at = time.time()
        pulse = read_pulse(self.marks_dir / SERVER_PULSE)
        if pulse is None:  # not one of ours, or it never started: nothing to measure against
            return ""
        beaten, timeout_s = pulse
        still = time.time() - max(beaten, self._workers_done_at)
        if still <= timeout_s:
            return ""
        how = "was stopped (SIGSTOP)" if process_state(pid) in ("T", "t") else "stopped answering"
        return (
            f"{how} after every worker had finished: its pulse (its final evaluation, saving "
            f"the results) stood still for {still:.0f} s (--timeout {timeout_s:g} s)"
        )

    def _wait(self, child: subprocess.Popen[bytes]) -> tuple[int, str]:
        """The child's exit status, and why we killed it for outliving the server ("" if we did
        not): the server has given up on it (or it hangs on its way out), and the agent would
        otherwise wait for it forever."""
        finished_at: float | None = None
        grace, why = GRACE_S, f"still running {GRACE_S:.0f} s after the server finished"
        while True:
            try:
                return child.wait(timeout=POLL_S), ""
            except subprocess.TimeoutExpired:
                pass
            if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
                child.kill()  # it did not end after the stop signal: stopped, or blocked
                return child.wait(), ""
            if self.rank == SERVER_RANK:
                abandoned = self._abandoned_server(child.pid) if self.lost_dir else ""
                why = abandoned or self._hung_at_the_end(child.pid)
                if why:
                    child.kill()  # nothing, if it ended since the wait above
                    if child.wait() == 0:  # it finished after all: not the hang we saw
                        return 0, ""
                    self._mark_cause(why)
                    print(
                        f"tether: server rank 0 {why}; the run fails", file=sys.stderr, flush=True
                    )
                    return 1, ""
            if self.lost_dir is None or not self.tolerated:
                continue
            if finished_at is None and (self.lost_dir / SERVER_FINISHED).exists():
                finished_at = time.monotonic()
                if given_up_by_server(self.lost_dir, self.rank):
                    grace, why = 0.0, "given up by the server, still running when it finished"
            if finished_at is not None and time.monotonic() - finished_at >= grace:
                child.kill()
                return child.wait(), why if self.stop_signal is None else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tether.launch.supervise")
    parser.add_argument(
        "--lost-dir",
        type=Path,
        help="tolerate the loss of a worker rank other than 0: record it here and exit 0",
    )
    parser.add_argument(
        "--marks-dir",
        type=Path,
        help="record here a child stopped or still running when the run is stopped",
    )
    parser.add_argument(
        "--stop-grace",
        type=float,
        default=STOP_GRACE_S,
        help="seconds a child may take to end after a forwarded stop signal",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to supervise")
    env = DistEnv.read()
    return Supervisor(
        command, args.lost_dir, env.rank, args.marks_dir, env.world_size, args.stop_grace
    ).run()


if __name__ == "__main__":
    sys.exit(main())
