"""The MPI transport under a real ``mpiexec``: every collective over ``MPITransport`` against the
naive one, MPI's own and the exact result, and the header-checked message protocol
(tests/distributed/mpi_worker.py holds the per-rank checks).

Skipped, with the reason, where mpi4py or mpiexec is missing (the ``mpi`` extra, ``pip install
-e '.[mpi]'``; ``make test`` installs it). A hung rank is killed by ``run_mpi``'s deadline and
fails the test.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from tether.errors import TetherError
from tether.launch import mpi as mpi_launch
from tether.launch.mpi import mpiexec_path, run_mpi

ROOT = Path(__file__).resolve().parents[2]
WORKER = [sys.executable, "-m", "tests.distributed.mpi_worker"]

needs_mpi = pytest.mark.skipif(
    find_spec("mpi4py") is None or mpiexec_path() is None,
    reason="mpi4py or mpiexec not installed: pip install 'tether[mpi]'",
)


def _run_worker(nprocs: int, mode: str) -> None:
    try:
        result = run_mpi(nprocs, [*WORKER, mode], timeout_s=120, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"MPI job of {nprocs} ranks hung; its output:\n{exc.output}\n{exc.stderr}")
    output = f"{result.stdout}\n{result.stderr}"
    ok = {int(r) for r in re.findall(r"RANK (\d+) OK \d+", result.stdout)}
    assert result.returncode == 0 and ok == set(range(nprocs)), output[-6000:]


@needs_mpi
def test_collectives_and_message_protocol_on_3_ranks() -> None:
    _run_worker(3, "all")


@needs_mpi
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the process tree through /proc")
def test_a_hung_job_is_killed_whole() -> None:
    """Ranks that ignore SIGTERM, each in a session of its own (hydra's setsid), still die."""
    marker = f"tether-hang-{time.monotonic_ns()}"
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_mpi(2, [sys.executable, "-c", code, marker], timeout_s=1.5)
    assert time.monotonic() - start < 1.5 + mpi_launch.TERM_GRACE_S + 5
    survivors = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                survivors.append(cmdline.parent.name)
        except OSError:
            continue
    assert survivors == [], f"processes left running: {survivors}"


def test_asking_for_mpi_without_mpi4py_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tether.comm.mpi_transport import MPITransport

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes `import mpi4py` fail
    with pytest.raises(TetherError, match=r"pip install 'tether\[mpi\]'") as info:
        MPITransport()
    assert "\n" not in str(info.value)

    monkeypatch.setattr(mpi_launch, "mpiexec_path", lambda: None)
    with pytest.raises(TetherError, match="no mpiexec found"):
        run_mpi(2, ["true"], timeout_s=5)


# Run by every rank: the TCP sockets in LISTEN state (0A in /proc/net/tcp*) among the open files
# of this rank and of its launcher (hydra's ranks inherit its control socket).
_LISTENERS = r"""
import os, sys
inodes = set()
for pid in (os.getpid(), os.getppid()):
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
found = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:
            found.append(fields[1])
os.write(1, f"LISTENING {sorted(found)}\n".encode())  # one write: no interleaving
"""


@needs_mpi
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads sockets from /proc")
def test_a_local_job_opens_no_listening_port() -> None:
    """Bind to nothing beyond loopback: a local MPICH job runs under mpiexec.gforker, which talks
    to its ranks over socket pairs (hydra's control port listens on 0.0.0.0)."""
    result = run_mpi(2, [sys.executable, "-c", _LISTENERS], timeout_s=60)
    lines = [line for line in result.stdout.splitlines() if line.startswith("LISTENING")]
    assert result.returncode == 0 and len(lines) == 2, result.stdout + result.stderr
    assert lines == ["LISTENING []"] * 2
