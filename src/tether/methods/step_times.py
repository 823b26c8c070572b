"""The time one training step spent waiting, as a method measures it for its caller."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepTimes:
    """Seconds one step spent waiting for communication, filled in by the method; the caller
    counts the rest of the step as computation."""

    comm_s: float = 0.0  # communication that was NOT hidden under computation
    # When those waits happened (``time.perf_counter`` start and end, as :meth:`waited` records
    # them), so that the timeline shows them where they were instead of laying durations out in
    # order: one preemption of a few milliseconds inside a step is enough for a layout by
    # durations to put sync SGD's wait after its update.
    comm_spans: list[tuple[float, float]] = field(default_factory=list)
    compute_s: float = 0.0  # set by the caller: the step's time minus comm_s and paused_s
    # Waits for a parameter server busy with its own work (evaluating, saving): neither
    # communication nor computation, so not the step's time (a run's training clock leaves
    # the server's evaluations out as well).
    paused_s: float = 0.0

    def waited(self, start: float, end: float, paused: float = 0.0) -> None:
        """Count the exposed communication from ``start`` to ``end`` (method clock readings),
        but for ``paused`` seconds of it that the server spent on its own work."""
        paused = min(max(paused, 0.0), end - start)
        self.comm_s += end - start - paused
        self.paused_s += paused
        if end > start:
            self.comm_spans.append((start, end))
