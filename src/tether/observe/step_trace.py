"""How the trainer lays one training step out on the timeline (:mod:`tether.observe.timeline`).

Methods report how long a step spent computing and when it waited for communication
(:class:`~tether.methods.base.StepTimes`); the optimizer update is timed by torch's global
optimizer hooks. :class:`StepTracer` places the waits and updates where they happened and lays the
computation (and any wait a method reports as a duration only) out in the gaps they leave, as
non-overlapping spans inside the step (viewers drop spans that overlap without nesting).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from tether.observe.timeline import Timeline


@contextmanager
def optimizer_steps(on_step: Callable[[float, float], None]) -> Iterator[None]:
    """Call ``on_step(start_s, end_s)`` after every ``torch.optim.Optimizer.step`` in this process
    while the block runs (``time.perf_counter`` seconds).

    Methods own their optimizers; torch's global step hooks let the trainer time the update
    without touching method code. Nothing is registered unless a timeline is being recorded.
    """
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    starts = threading.local()  # optimizers may step on several threads (Hogwild)

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        starts.value = time.perf_counter()

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        end = time.perf_counter()
        on_step(getattr(starts, "value", end), end)

    handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def current_track() -> str:
    """``main`` on the main thread, else the thread's name: one row per thread in the viewer."""
    thread = threading.current_thread()
    return "main" if thread is threading.main_thread() else thread.name


def place_in_gaps(
    start_s: float,
    end_s: float,
    pieces: Sequence[tuple[str, str, float]],
    busy: Sequence[tuple[float, float]] = (),
) -> list[tuple[str, str, float, float]]:
    """Lay out measured durations, in order, inside ``[start_s, end_s]`` around ``busy`` intervals.

    A method reports only how long a step spent computing and waiting for communication
    (:class:`~tether.methods.base.StepTimes`), not when; the optimizer step, timed by hooks, is
    the one interval whose position is known. Placing ``pieces`` ``(name, cat, seconds)`` one
    after the other in the free time, moving a piece to the next free gap when it does not fit
    in what is left of the current one, reproduces both orders that occur: sync SGD computes,
    waits for its all-reduce, then steps the optimizer; local SGD and EASGD compute and step,
    then communicate. Durations are kept, except that pieces that overrun their gap (by the
    microseconds a method counts around its optimizer step) are shortened from the first, so
    spans never overlap the update or leave the step; positions within a step are as exact as
    that order is. Returns ``(name, cat, start_s, end_s)``.
    """
    gaps: list[tuple[float, float]] = []
    cursor = start_s
    for b_start, b_end in sorted(busy):
        b_start, b_end = max(b_start, start_s), min(b_end, end_s)
        if b_start > cursor:
            gaps.append((cursor, b_start))
        cursor = max(cursor, b_end)
    if cursor < end_s or not gaps:
        gaps.append((cursor, max(cursor, end_s)))

    def fits(used: float, seconds: float, length: float) -> bool:
        # Stays if it overflows by no more than clock-reading noise (a method's compute time
        # includes the statements around its optimizer step), or if most of it fits.
        room = length - used
        return seconds - room <= 100e-6 + 0.1 * seconds or room >= seconds / 2

    # Which gap each piece goes in: in order, moving on when it does not fit what is left. The
    # first piece begins the step (every method starts with forward and backward) and stays in
    # the first gap whatever its length: a method's compute time can include a stall after its
    # last known interval (a preemption, a garbage collection), which must not move it later.
    groups: list[list[tuple[str, str, float]]] = [[] for _ in gaps]
    index, used, first = 0, 0.0, True
    for name, cat, seconds in pieces:
        if seconds <= 0:
            continue
        if not first and not fits(used, seconds, gaps[index][1] - gaps[index][0]):
            for later in range(index + 1, len(gaps)):  # none fits: it stays, and is cut below
                if fits(0.0, seconds, gaps[later][1] - gaps[later][0]):
                    index, used = later, 0.0
                    break
        groups[index].append((name, cat, seconds))
        used += seconds
        first = False
    # Pieces longer together than their gap give up the excess from the first one: a method's
    # compute time is where the extra statements are counted; its measured wait is kept whole.
    placed = []
    for (gap_start, gap_end), group in zip(gaps, groups, strict=True):
        excess = sum(seconds for _, _, seconds in group) - (gap_end - gap_start)
        cursor = gap_start
        for name, cat, seconds in group:
            cut = min(max(excess, 0.0), seconds)
            excess -= cut
            placed.append((name, cat, cursor, cursor + seconds - cut))
            cursor += seconds - cut
    return placed


class StepTracer:
    """Puts the trainer's steps on a timeline from the timings it already takes for
    metrics.jsonl (data, compute, exposed communication), plus the optimizer steps, timed by
    :func:`optimizer_steps`. Does nothing on a disabled timeline."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.updates: list[tuple[float, float]] = []  # optimizer steps of the current step
        self.in_step = False

    def timing_updates(self) -> AbstractContextManager[None]:
        """While the block runs, optimizer steps are timed (only when the timeline records)."""
        if not self.timeline.enabled:
            return nullcontext()
        return optimizer_steps(self._on_update)

    def _on_update(self, start: float, end: float) -> None:
        if self.in_step and threading.current_thread() is threading.main_thread():
            self.updates.append((start, end))  # placed with the rest of the step
        else:  # a server's or another thread's update
            self.timeline.record("optimizer step", "compute", start, end, current_track())

    def before_step(self) -> float:
        """Call right before the method's step; returns the time to pass to :meth:`step`."""
        self.updates.clear()
        self.in_step = True
        return time.perf_counter()

    def step(
        self,
        step: int,
        begin: float,
        data_s: float,
        called: float,
        compute_s: float,
        comm_s: float,
        comm_spans: Sequence[tuple[float, float]] = (),
    ) -> None:
        """Record step ``step``: it began (data loading) at ``begin``, the method was called at
        ``called`` and has just returned; ``compute_s``, ``comm_s`` and ``comm_spans`` (when
        the waits happened, where the method says) are the method's StepTimes."""
        returned = time.perf_counter()
        self.in_step = False
        record, updates = self.timeline.record, self.updates
        record("step", "step", begin, returned, step=step)
        record("data", "data", begin, begin + data_s, step=step)
        # The method's compute includes the updates timed apart: what is left is forward and
        # backward (with no optimizer step timed in it, it stays "compute").
        compute_s -= sum(end - start for start, end in updates)
        # Waits whose times are known go where they happened; only a remainder (a method that
        # reports durations alone) is laid out by duration with the computation.
        unplaced_comm_s = comm_s - sum(end - start for start, end in comm_spans)
        pieces = [
            ("forward+backward" if updates else "compute", "compute", compute_s),
            ("comm wait", "comm", unplaced_comm_s if unplaced_comm_s > 1e-6 else 0.0),
        ]
        known = [*updates, *comm_spans]
        for name, cat, start, end in place_in_gaps(called, returned, pieces, known):
            record(name, cat, start, end, step=step)
        for start, end in comm_spans:
            record("comm wait", "comm", start, end, step=step)
        for start, end in updates:
            record("optimizer step", "compute", start, end, step=step)
