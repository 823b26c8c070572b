"""Fault injection for the reliability tests: one rank fails at one step the way a real worker
can fail (``fault_rank``, ``fault_step``, ``fault_kind`` in the config)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from tether.config import TrainConfig


def _mark(run_dir: Path) -> None:
    # The wall-clock time of the fault, so a test can measure how fast the run stops.
    (run_dir / "injected_fault.txt").write_text(f"{time.time()}\n")


def _hang() -> None:
    while True:
        time.sleep(1)


def maybe_inject_fault(config: TrainConfig, rank: int, step: int, run_dir: Path) -> None:
    """Raise, die by SIGKILL, hang for ever or stop (SIGSTOP), if this is the configured rank
    and step (``hang-after-send`` is injected by :func:`send_fault` instead)."""
    if config.fault_rank != rank or step != config.fault_step:
        return
    if config.fault_kind == "hang-after-send":
        return
    _mark(run_dir)
    if config.fault_kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if config.fault_kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return  # continued (SIGCONT): the process goes on as a real stopped one would
    if config.fault_kind == "hang":
        _hang()
    raise RuntimeError(f"injected fault at step {step}")


def send_fault(config: TrainConfig, rank: int, run_dir: Path) -> Callable[[int], None] | None:
    """For ``hang-after-send``: a hook for a parameter-server worker's link that hangs once the
    worker has sent its message of step ``fault_step`` or later, before it reads the reply."""
    if config.fault_rank != rank or config.fault_kind != "hang-after-send":
        return None

    def hang_after(step: int) -> None:
        if step >= config.fault_step:
            _mark(run_dir)
            _hang()

    return hang_after
