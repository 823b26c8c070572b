"""Nothing a run starts listens outside loopback (issue: the launcher's two stores listened on
every interface, unauthenticated). The run's listening sockets are read from /proc while it
trains: every process of its tree, every TCP socket in the LISTEN state."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import requires_fashion_mnist

LISTEN = "0A"  # the TCP state in /proc/net/tcp


def _listening_inodes() -> dict[str, str]:
    """Every listening TCP socket of the machine: inode -> local address."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if fields[3] == LISTEN:
                    found[fields[9]] = fields[1]
    return found


def _tree(root: int) -> list[int]:
    """``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _is_loopback(address: str) -> bool:
    host = address.split(":")[0]
    if len(host) == 8:  # IPv4, little-endian hex: 127.x.x.x ends with 7F
        return host.endswith("7F")
    return host == "00000000000000000000000001000000"  # ::1


def _listeners_during(args: list[str], seconds: float = 150) -> set[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            listening = _listening_inodes()
            for pid in _tree(proc.pid):
                seen |= {listening[i] for i in _socket_inodes(pid) if i in listening}
            time.sleep(0.2)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert code == 0, proc.stdout.read() if proc.stdout else code
    finally:
        proc.kill()
    return seen


@requires_fashion_mnist
@pytest.mark.parametrize("method", ["async-easgd"])  # a server, its workers and supervisors
def test_a_local_run_listens_on_loopback_only(tmp_path: Path, method: str) -> None:
    args = ["train", "--method", method, "--workers", "2", "--steps", "100", "--no-progress"]
    args += ["--eval-every", "100"]
    seen = _listeners_during([*args, "--out", str(tmp_path / "run")])
    # The rendezvous store and the workers' store at least (gloo's pairs add their own).
    assert len(seen) >= 2, seen
    outside = sorted(a for a in seen if not _is_loopback(a))
    assert outside == [], f"listening outside loopback: {outside}"


def test_bench_comm_listens_on_loopback_only() -> None:
    args = ["bench", "comm", "--workers", "2", "--sizes", "4KB", "--repeats", "200"]
    seen = _listeners_during(args)
    assert len(seen) >= 2, seen
    assert sorted(a for a in seen if not _is_loopback(a)) == []
