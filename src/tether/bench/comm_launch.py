"""Starting the ranks of ``tether bench comm`` on this machine: torch's elastic launcher, or
``mpiexec`` for the MPI transport; each rank's deadline turns a hang into a one-line error."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tether.bench.comm_spec import BACKSTOP_S
from tether.errors import TetherError, WorkerFailure

if TYPE_CHECKING:  # torch is imported where it is used: `tether --help` need not load it
    pass


WORKER_MODULE = "tether.bench.comm_worker"


def hang_file(out_file: Path, rank: int) -> Path:
    """Where a rank's stacks go when its deadline passes (faulthandler)."""
    return out_file.parent / f"hang-rank{rank}.txt"


def launch_torch(workers: int, argv: Sequence[str], timeout_s: float, run_dir: Path) -> None:
    """Run ``workers`` processes of the worker module with the local elastic launcher (the engine
    behind torchrun: c10d rendezvous on 127.0.0.1, no restarts, so a failed rank stops the rest).

    Each worker arms a deadline (faulthandler: a C thread that dumps every stack and exits even if
    the rank is stuck in a collective), so a hung rank ends the run near ``timeout_s``."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from tether.launch.exits import stopped
    from tether.launch.failure_report import describe_failures
    from tether.launch.local import local_launch_config
    from tether.launch.loopback import stores_of_a_launch

    launch = local_launch_config(workers, "tether-bench", monitor_s=0.1)
    try:
        with stores_of_a_launch():
            elastic_launch(launch, sys.executable)("-m", WORKER_MODULE, *argv)
    except ChildFailedError as error:
        message, ranks = describe_failures(error, run_dir / "failures.log")
        raise WorkerFailure(_hung_ranks(run_dir, timeout_s) or message, ranks) from None
    except SignalException as stop:  # we were told to stop (Ctrl-C, kill): so were the ranks
        raise stopped(stop) from None
    finally:
        _remove_empty_hang_files(run_dir)


def _hung_ranks(run_dir: Path, timeout_s: float) -> str:
    """The one-line error of a run stopped by the ranks' deadline, or "" if it was not."""
    hung = sorted(p.name for p in run_dir.glob("hang-*.txt") if p.stat().st_size)
    if not hung:
        return ""
    return (
        f"the benchmark did not finish within --timeout {timeout_s:g} s (a hung rank?); the "
        f"ranks' stacks are in {run_dir}/{{{','.join(hung)}}}"
    )


def _remove_empty_hang_files(run_dir: Path) -> None:
    """A rank killed by the launcher (after another failed) leaves its deadline file empty."""
    for stale in run_dir.glob("hang-*.txt"):
        if not stale.stat().st_size:
            stale.unlink(missing_ok=True)


def launch_mpi(workers: int, argv: Sequence[str], timeout_s: float, run_dir: Path) -> None:
    """Run the worker module on ``workers`` MPI ranks through :func:`tether.launch.mpi.run_mpi`
    (which kills the whole process tree past its deadline). The ranks' output is captured into
    ``run_dir/mpi.log``."""
    import subprocess

    try:
        from tether.launch.mpi import run_mpi
    except ImportError:
        raise TetherError(
            "--transport mpi needs tether.launch.mpi, which this version lacks; use --transport torch"
        ) from None
    command = [sys.executable, "-m", WORKER_MODULE, *argv]
    try:
        # The ranks' own deadline fires first and leaves their stacks; this one is the backstop.
        result = run_mpi(workers, command, timeout_s + BACKSTOP_S)
    except subprocess.TimeoutExpired as expired:
        _write_log(run_dir / "mpi.log", expired.output, expired.stderr)
        raise WorkerFailure(
            f"the benchmark did not finish within --timeout {timeout_s:g} s; mpiexec was "
            f"stopped (output in {run_dir / 'mpi.log'})",
            [],
        ) from None
    _write_log(run_dir / "mpi.log", result.stdout, result.stderr)
    if result.returncode != 0:
        hung = _hung_ranks(run_dir, timeout_s)
        _remove_empty_hang_files(run_dir)
        lines = [line for line in (result.stderr or "").splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else "no message"
        raise WorkerFailure(
            hung
            or f"mpiexec exited with code {result.returncode}: {reason} (output in "
            f"{run_dir / 'mpi.log'})",
            [],
        )


def _write_log(path: Path, stdout: str | bytes | None, stderr: str | bytes | None) -> None:
    def text(value: str | bytes | None) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else value or ""

    path.write_text(f"== stdout ==\n{text(stdout)}\n== stderr ==\n{text(stderr)}")
