"""Per-step timing and the metrics.jsonl log.

Each step's wall time is split into data loading, compute and *exposed* communication (the part not
hidden under computation). ``comm_fraction`` in summary.json is exposed communication over total
step time, summed over every computing worker.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from tether.observe.files import json_safe


@dataclass
class PhaseTotals:
    """Sums over the steps this rank has run (or, after :meth:`all_reduced`, over all ranks)."""

    data_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    steps: int = 0
    samples: int = 0

    def add(self, data_s: float, compute_s: float, comm_s: float, samples: int) -> None:
        self.data_s += data_s
        self.compute_s += compute_s
        self.comm_s += comm_s
        self.steps += 1
        self.samples += samples

    def __add__(self, other: PhaseTotals) -> PhaseTotals:
        return PhaseTotals(
            self.data_s + other.data_s,
            self.compute_s + other.compute_s,
            self.comm_s + other.comm_s,
            self.steps + other.steps,
            self.samples + other.samples,
        )

    def as_tensor(self) -> torch.Tensor:
        values = [self.data_s, self.compute_s, self.comm_s, self.steps, self.samples]
        return torch.tensor(values, dtype=torch.float64)

    @staticmethod
    def from_tensor(tensor: torch.Tensor) -> PhaseTotals:
        data_s, compute_s, comm_s, steps, samples = tensor.tolist()
        return PhaseTotals(data_s, compute_s, comm_s, int(steps), int(samples))

    def all_reduced(self, all_reduce: Callable[[torch.Tensor], Any], group: int = 1) -> PhaseTotals:
        """Every rank's totals summed (``all_reduce`` sums a tensor over the ranks, in place;
        collective). The ranks of a model group of ``group`` process the same samples: counted
        once."""
        tensor = self.as_tensor()
        all_reduce(tensor)
        summed = PhaseTotals.from_tensor(tensor)
        summed.samples //= group
        return summed

    @property
    def step_s(self) -> float:
        return self.data_s + self.compute_s + self.comm_s

    @property
    def comm_fraction(self) -> float:
        return self.comm_s / self.step_s if self.step_s > 0 else 0.0


class MetricsLog:
    """Append-only JSON Lines log; a no-op object on ranks that do not write."""

    def __init__(self, path: Path | None, append: bool = False) -> None:
        self._file: IO[str] | None = None
        self._diverged = False  # a training loss that was not finite has been said
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Line-buffered: each record reaches the OS as it is written (a write call per step,
            # microseconds), so a rank killed outright loses none of its step lines.
            self._file = path.open("a" if append else "w", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        loss = record.get("loss")
        if isinstance(loss, float) and not math.isfinite(loss) and not self._diverged:
            self._diverged = True  # once: every later step says the same
            print(
                f"tether: warning: the training loss is {loss} at step {record.get('step')}: "
                "the run diverged; lower the learning rate, or clip the gradients "
                "(--clip-grad-norm; clip_grad_norm in Python)",
                file=sys.stderr,
                flush=True,
            )
        try:  # a line per step: the record is walked only when it holds a NaN or an inf
            line = json.dumps(record, allow_nan=False)
        except ValueError:  # written as null: JSON has no NaN (json_safe)
            line = json.dumps(json_safe(record), allow_nan=False)
        self._file.write(line + "\n")

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records after ``last_step`` (a resumed run repeats them from its checkpoint). A
    worker's loss report logged at ``last_step`` itself arrived after the server's checkpoint
    there (it is logged at the global step as of its arrival), so it goes too."""
    if not path.exists():
        return

    def kept_line(record: dict) -> bool:
        step = record.get("step", 0)
        return step < last_step or (step == last_step and "worker" not in record)

    kept = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and kept_line(json.loads(line))
    ]
    path.write_text("".join(line + "\n" for line in kept))
