"""Run a program under ``mpiexec`` on this machine, with a deadline that cannot be outlived.

For tests, benchmarks and single-machine MPI runs. Multi-node MPI jobs are started by the site's
own ``mpiexec`` or ``srun``; Tether adds nothing to those.

Two things make a local ``mpiexec`` unsafe to call from a test as it comes:

* A hung rank hangs ``mpiexec``, and MPICH's launcher (hydra) starts every rank in a session of
  its own (``setsid``), so killing ``mpiexec``'s process group leaves the ranks running. On a
  timeout :func:`run_mpi` asks ``mpiexec`` to stop, then kills every process descended from it,
  found through ``/proc`` before anything is killed (an orphan is re-parented and lost to a
  later walk).
* MPI libraries listen on the machine's external address by default. MPICH's hydra keeps a
  control port open on all addresses for the life of the job (``-iface lo`` and ``-localhost``
  do not move it), so where MPICH ships its single-machine launcher ``mpiexec.gforker`` (the
  ``mpich`` wheel does), that runs the job instead: it forks the ranks and speaks to them over
  socket pairs, with no listening port at all. Otherwise hydra uses the fork launcher (no ssh),
  ``-iface lo`` and ``-bind-to none`` (ranks share the few cores; pinning several ranks to one
  core serialises them). The network layers MPICH may load (UCX, libfabric) are told to use
  loopback. Open MPI's ``mpiexec`` gets the equivalent flags and, as root,
  ``--allow-run-as-root``, without which it refuses to start.

Every rank gets ``OMP_NUM_THREADS=1`` unless the caller's environment says otherwise: N ranks
on a few cores with a full OpenMP team each would thrash.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from tether.errors import TetherError
from tether.launch.proctree import descendants, signal_all

# Network layers under MPICH: loopback only for a single-machine job.
LOOPBACK_ENV = {
    "UCX_NET_DEVICES": "lo",
    "FI_TCP_IFACE": "lo",
    "FI_SOCKETS_IFACE": "lo",
}
TERM_GRACE_S = 2.0  # how long mpiexec gets to stop its ranks after SIGTERM before SIGKILL


def mpiexec_path() -> str | None:
    """The ``mpiexec`` beside this Python (the ``mpich`` wheel of ``tether[mpi]`` installs one
    into the virtual environment), else the first on PATH, else None."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


@functools.lru_cache(maxsize=8)
def launcher_kind(mpiexec: str) -> str:
    """Which ``mpiexec`` this is, from its ``--version``: "hydra" (MPICH), "openmpi" or ""."""
    try:
        version = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    if "HYDRA" in version:
        return "hydra"
    if "Open MPI" in version or "OpenRTE" in version:
        return "openmpi"
    return ""


def launcher_flags(mpiexec: str, as_root: bool) -> tuple[str, ...]:
    """Options for a local job, by launcher: MPICH's hydra, Open MPI's, or none (unknown)."""
    kind = launcher_kind(mpiexec)
    if kind == "hydra":
        return ("-launcher", "fork", "-iface", "lo", "-bind-to", "none")
    if kind == "openmpi":  # Open MPI refuses root unless told
        flags = ("--oversubscribe", "--bind-to", "none", "--mca", "btl_tcp_if_include", "lo")
        return (*flags, "--allow-run-as-root") if as_root else flags
    return ()


def mpi_command(nprocs: int, argv: Sequence[str], mpiexec: str | None = None) -> list[str]:
    """``mpiexec -n N <argv>`` with the local-job flags (MPICH's ``mpiexec.gforker`` where there
    is one: no listening port); TetherError if there is no mpiexec."""
    if nprocs < 1:
        raise TetherError(f"an MPI job needs at least one process, got {nprocs}")
    mpiexec = mpiexec or mpiexec_path()
    if mpiexec is None:
        raise TetherError("no mpiexec found: pip install 'tether[mpi]' (mpi4py and mpich)")
    gforker = Path(mpiexec).with_name("mpiexec.gforker")
    if launcher_kind(mpiexec) == "hydra" and gforker.is_file() and os.access(gforker, os.X_OK):
        return [str(gforker), "-n", str(nprocs), *argv]
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    return [mpiexec, *launcher_flags(mpiexec, as_root), "-n", str(nprocs), *argv]


JOB_MARKER = "TETHER_MPI_JOB"


def run_mpi(
    nprocs: int,
    argv: Sequence[str],
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` on ``nprocs`` MPI ranks of this machine and capture their output (text).

    ``env`` is the ranks' whole environment (default: this process's), with ``OMP_NUM_THREADS``
    and the loopback settings added where it does not set them. After ``timeout_s`` seconds the
    whole process tree is killed and ``subprocess.TimeoutExpired`` is raised, carrying what the
    ranks printed so far: a hung rank never hangs the caller."""
    command = mpi_command(nprocs, argv)
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("OMP_NUM_THREADS", "1")
    for name, value in LOOPBACK_ENV.items():
        child_env.setdefault(name, value)
    # Every process of the job inherits this marker, so a kill finds the ranks even after their
    # parents died and they were re-parented (the tree walk alone misses those).
    job = uuid.uuid4().hex
    child_env[JOB_MARKER] = job
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,  # hydra forwards stdin to rank 0; a test's must stay untouched
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env,
        cwd=cwd,
        start_new_session=True,  # our signals, and the terminal's, reach only what we kill
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_tree(proc, job)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(command, timeout_s, output=stdout, stderr=stderr) from None
    except BaseException:  # KeyboardInterrupt included: never leave ranks behind
        _kill_tree(proc, job)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _marked(job: str) -> list[int]:
    """Pids of the processes whose environment carries this job's marker (Linux /proc)."""
    needle = f"{JOB_MARKER}={job}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:  # exited, or not ours to read
            continue
    return found


def _kill_tree(proc: subprocess.Popen[str], job: str) -> None:
    """SIGTERM to ``mpiexec`` (hydra then stops its ranks and removes their shared memory), and
    after a grace period SIGKILL to it, every descendant it had (in its own session or not), and
    every process carrying the job's marker (ranks started late or re-parented)."""
    if proc.poll() is not None:
        signal_all(_marked(job), signal.SIGKILL)
        return
    ranks = descendants(proc.pid)
    signal_all([proc.pid], signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks += [pid for pid in descendants(proc.pid) if pid not in ranks]
    signal_all([proc.pid, *ranks], signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything left in mpiexec's own session
    proc.wait()
    for _ in range(20):  # a rank forked while we were killing: until none is left
        left = [pid for pid in _marked(job) if pid != os.getpid()]
        if not left:
            break
        signal_all(left, signal.SIGKILL)
        time.sleep(0.05)
