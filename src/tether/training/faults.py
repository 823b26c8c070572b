"""Fault injection for the reliability tests: one rank fails at one step the way a real worker
can fail (``fault_rank``, ``fault_step``, ``fault_kind`` in the config)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tether.config import TrainConfig


def maybe_inject_fault(config: TrainConfig, rank: int, step: int, run_dir: Path) -> None:
    """Raise, die by SIGKILL or hang for ever, if this is the configured rank and step."""
    if config.fault_rank != rank or step != config.fault_step:
        return
    # The wall-clock time of the fault, so a test can measure how fast the run stops.
    (run_dir / "injected_fault.txt").write_text(f"{time.time()}\n")
    if config.fault_kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if config.fault_kind == "hang":
        while True:
            time.sleep(1)
    raise RuntimeError(f"injected fault at step {step}")
