"""Shared fixtures: the Fashion-MNIST location and a helper to run the CLI as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

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
