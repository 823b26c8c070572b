"""What a run has done so far, apart from its weights: the step it resumed at, its evaluation
history, the wall time spent before a resume, the evaluation time left out of the history's
training time, and when it reached its target. A checkpoint saves it; a resume restores it; the
summary reports it. (The phase totals and the method's counters are checkpointed with the
ranks' and the method's state: training.run_checkpoints.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.targets import Target


@dataclass
class RunRecord:
    start_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    elapsed_before: float = 0.0  # wall seconds spent before a resume
    eval_s: float = 0.0  # evaluation time, excluded from the history's training time
    time_to_target: float | None = None
    # training seconds before a resume whose samples the phase totals do not count (a
    # checkpoint that kept none: training.run_checkpoints), left out of samples_per_s
    uncounted_s: float = 0.0

    def checkpoint_fields(self, elapsed: float) -> dict[str, Any]:
        """The checkpoint's part of the record (``elapsed``: wall seconds so far)."""
        return {
            "history": self.history,
            "elapsed_s": elapsed,
            "eval_s": self.eval_s,
            "time_to_target_s": self.time_to_target,
        }

    @classmethod
    def resumed(cls, state: dict[str, Any]) -> RunRecord:
        """The record as a checkpoint left it (validated by the launcher before any worker
        started: tether.training.run_dir)."""
        return cls(
            start_step=int(state["step"]),
            history=list(state["history"]),
            elapsed_before=float(state["elapsed_s"]),
            eval_s=float(state.get("eval_s", 0.0)),
            time_to_target=state["time_to_target_s"],
        )

    def retarget(self, target: Target | None) -> None:
        """The time to ``target`` as the history reached it: a resume may change the target
        (or drop it), and the checkpoint's time is the time to the target it was made under."""
        self.time_to_target = None
        if target is None:
            return
        for entry in self.history:
            value = entry.get(f"test_{target.metric}")
            if value is not None and target.reached(value):
                self.time_to_target = entry["time_s"]
                return

    def done(self, total_steps: int, stop_at_target: bool) -> bool:
        """Whether a resumed run has nothing left to do: it is at its last step, or stops at
        its target and reached it (:meth:`retarget` first: a resume may change the target)."""
        return self.start_step >= total_steps or (
            stop_at_target and self.time_to_target is not None
        )

    def count_nothing_before(self) -> None:
        """The phase totals of the resumed run count none of the samples before its checkpoint:
        samples_per_s leaves out the training time they took (its evaluations are out of the
        training clock already, eval_s being restored with the record: not twice)."""
        self.uncounted_s = max(0.0, self.elapsed_before - self.eval_s)
