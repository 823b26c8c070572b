"""Shared fixtures: the Fashion-MNIST location, a helper to run the CLI as a user would, and
what a run's processes do, read from /proc (which of them live on, where they listen)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_cli(*args: str, timeout: float = 120, module: str = "tether") -> CliResult:
    """Run ``python -m tether ARGS`` in a subprocess (the console script's code path)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)


requires_fashion_mnist = pytest.mark.skipif(
    not (FASHION_MNIST / "train-images-idx3-ubyte.gz").exists(),
    reason="Fashion-MNIST not installed (make data / apt-get install dataset-fashion-mnist)",
)


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module (a script, not a package: it imports its sibling
    ``_common`` from its own directory)."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(folder))


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (the run directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(proc.name))
    return found


# -- where a run listens: its process tree's listening TCP sockets, read from /proc --------------
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


def listening_sockets_of(pid: int) -> set[str]:
    """The local addresses (hex ``host:port``) on which process ``pid`` itself listens."""
    listening = _listening_inodes()
    return {listening[inode] for inode in _socket_inodes(pid) if inode in listening}


def is_loopback(address: str) -> bool:
    """Whether a /proc/net/tcp{,6} local address (hex ``host:port``) is on loopback."""
    host = address.split(":")[0]
    if len(host) == 8:  # IPv4, little-endian hex: 127.x.x.x ends with 7F
        return host.endswith("7F")
    return host == "00000000000000000000000001000000"  # ::1


def run_cli_listening(*args: str, timeout: float = 120) -> tuple[CliResult, set[str]]:
    """:func:`run_cli`, reading every 0.2 s which TCP addresses the run's processes (the
    command and all its descendants) listen on while it runs; returns the result and every
    listening address seen."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    # The pipes are drained by threads: a full pipe would stall the run while it is watched.
    output: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda name=name, pipe=pipe: output.update({name: pipe.read()}))
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            listening = _listening_inodes()
            for pid in _tree(proc.pid):
                seen |= {listening[i] for i in _socket_inodes(pid) if i in listening}
            time.sleep(0.2)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        proc.kill()
        for reader in readers:
            reader.join(timeout=10)
    seconds = time.perf_counter() - start
    return CliResult(code, output.get("stdout", ""), output.get("stderr", ""), seconds), seen


def pytest_configure(config: pytest.Config) -> None:
    """Every process of the session shares one data cache and one measurement cache (the
    collectives' calibrations) of its own, removed at the end: the user's ~/.cache is left
    alone, one load of a data set serves every run of the session, and a calibration is
    measured once per group shape in every session, on a fresh CI machine as here."""
    made = []
    for variable, prefix in (
        ("TETHER_DATA_CACHE", "tether-test-data-"),
        ("TETHER_CACHE_DIR", "tether-test-cache-"),
    ):
        if variable not in os.environ:
            os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
            made.append(os.environ[variable])
    config._tether_caches = made  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    for made in getattr(config, "_tether_caches", []):
        shutil.rmtree(made, ignore_errors=True)
