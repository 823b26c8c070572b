"""Figures of runs, drawn with matplotlib's Agg canvas (no display, no pyplot global state).

:func:`plot_comparison` turns the rows of a method comparison (see
:mod:`tether.observe.compare`) into one PNG: test accuracy against training time, and where each
method's time went (data loading, computation, communication not hidden, everything else).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from tether.observe.files import atomic_write

# (key in time_split_s, legend label, colour); "other" is wall time minus the three parts.
SEGMENTS = (
    ("data", "data loading", "#8fbc8f"),
    ("compute", "computation", "#4c72b0"),
    ("comm", "communication (not hidden)", "#dd8452"),
    ("other", "other (evaluation, logging, idle)", "#cfcfcf"),
)
LINE_STYLES = ("-", "--", "-.", ":")
# Matplotlib's default cycle with its grey (C7) swapped for black: grey marks failed methods.
METHOD_COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "black", "C8", "C9")


def _method_colour(index: int) -> str:
    return METHOD_COLOURS[index % len(METHOD_COLOURS)]


def time_split_per_worker(row: dict[str, Any]) -> dict[str, float] | None:
    """Seconds per worker in each segment; the segments add up to the wall time (or more).

    ``time_split_s`` is summed over workers, so it is divided by the worker count. Whatever the
    wall time holds beyond the three measured parts is "other"; None if the run has no split.
    """
    split, workers, wall = row.get("time_split_s"), row.get("workers"), row.get("wall_time_s")
    if not split or not workers or wall is None:
        return None
    parts = {key: float(split.get(key, 0.0)) / workers for key in ("data", "compute", "comm")}
    parts["other"] = max(float(wall) - sum(parts.values()), 0.0)
    return parts


def _plot_accuracy(ax: Axes, rows: Sequence[dict[str, Any]], target: float | None) -> None:
    for index, row in enumerate(rows):
        label = row["method"]
        if row["status"] != "ok":
            ax.plot([], [], "x", color="0.5", label=f"{label} (failed)")
            continue
        if row.get("lost_workers"):
            label += " (lost workers)"
        history = row.get("history") or []
        times = [h["time_s"] for h in history]
        accuracy = [h["test_accuracy"] for h in history]
        ax.plot(
            times,
            accuracy,
            marker="o",
            markersize=3.5,
            linewidth=1.8,
            linestyle=LINE_STYLES[(index // len(METHOD_COLOURS)) % len(LINE_STYLES)],
            color=_method_colour(index),
            label=label,
        )
    if target is not None:
        ax.axhline(target, color="0.3", linestyle="--", linewidth=1.0, label=f"target {target:.0%}")
    if not any(row["status"] == "ok" and row.get("history") for row in rows):
        ax.set_ylim(0, 1)  # nothing to draw: show the full range rather than a sliver
        ax.set_xlim(0, 1)
    # The history's times leave out the evaluation pauses (see the trainer): say so.
    ax.set_xlabel("training time (s from the first step, evaluation pauses excluded)")
    ax.set_ylabel("test accuracy")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.set_title("Test accuracy against training time")
    ax.legend(loc="best", fontsize="small")


def _plot_time_split(ax: Axes, rows: Sequence[dict[str, Any]]) -> None:
    names = [row["method"] for row in rows]
    positions = list(range(len(rows)))
    splits = [time_split_per_worker(row) for row in rows]
    longest = max((sum(s.values()) for s in splits if s), default=1.0) or 1.0
    lefts = [0.0] * len(rows)
    for key, label, colour in SEGMENTS:
        widths = [s[key] if s else 0.0 for s in splits]
        ax.barh(positions, widths, left=lefts, height=0.6, color=colour, label=label)
        lefts = [a + b for a, b in zip(lefts, widths, strict=True)]
    for pos, row, split in zip(positions, rows, splits, strict=True):
        if row["status"] != "ok":
            note = "failed"
        elif split is None:
            note = "no time split"
        else:
            note = f"{row['wall_time_s']:.1f} s"
        ax.text(
            (sum(split.values()) if split else 0.0) + 0.01 * longest,
            pos,
            note,
            va="center",
            fontsize="small",
        )
    ax.set_yticks(positions, names)
    for tick, index in zip(ax.get_yticklabels(), positions, strict=True):
        tick.set_color(_method_colour(index) if rows[index]["status"] == "ok" else "0.5")
    ax.invert_yaxis()  # first method on top, as in the table
    ax.set_xlim(0, longest * 1.3)  # room for the notes at the bar ends
    ax.set_xlabel("seconds per worker (bar length = wall time)")
    ax.set_title("Where the time went")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=2, fontsize="small")


def plot_comparison(
    rows: Sequence[dict[str, Any]], path: Path, *, title: str, target: float | None = None
) -> Path:
    """Draw the comparison figure for ``rows`` into the PNG file ``path`` and return ``path``.

    Left: test accuracy against training time, one line per method, the target as a dashed line.
    Right: one horizontal bar per method, its wall time per worker split into data loading,
    computation, communication not hidden, and the rest.
    """
    height = max(4.8, 2.2 + 0.45 * len(rows))
    figure = Figure(figsize=(13.5, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2, width_ratios=[1.25, 1])
    _plot_accuracy(left, rows, target)
    _plot_time_split(right, rows)
    figure.suptitle(title, fontsize="large", fontweight="bold")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    atomic_write(path, lambda handle: handle.write(buffer.getvalue()))
    return path
