"""Figures of the performance model: where an iteration's time goes, how throughput scales
against the ideal line, and the simulator's staleness distribution (matplotlib's Agg canvas)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tether.observe.files import atomic_write

BREAKDOWN = (
    ("data + forward + backward", "#4c72b0"),
    ("update", "#8fbc8f"),
    ("communication (not hidden)", "#dd8452"),
)


def _save(figure: Figure, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    atomic_write(path, lambda handle: handle.write(buffer.getvalue()))
    return path


def plot_breakdown(rows: Sequence[Mapping[str, Any]], path: Path, *, title: str) -> Path:
    """One horizontal bar per prediction (``label``, ``compute_s``, ``update_s``,
    ``exposed_comm_s``, in seconds): the iteration split into its parts, in milliseconds."""
    figure = Figure(figsize=(9, max(3.2, 1.8 + 0.42 * len(rows))), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    labels = [str(r["label"]) for r in rows]
    parts = [
        [1e3 * (r["compute_s"] - r["update_s"]) for r in rows],
        [1e3 * r["update_s"] for r in rows],
        [1e3 * r["exposed_comm_s"] for r in rows],
    ]
    left = [0.0] * len(rows)
    for (name, colour), values in zip(BREAKDOWN, parts, strict=True):
        ax.barh(labels, values, left=left, color=colour, label=name)
        left = [a + b for a, b in zip(left, values, strict=True)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.3g} ms", va="center", fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("predicted time per iteration (ms)")
    ax.set_xlim(0, max(left, default=1.0) * 1.18 or 1.0)
    # below the axes and their label (the layout makes room): inside, it would hide bars
    figure.legend(loc="outside lower center", ncol=3, fontsize="small")
    ax.set_title(title)
    return _save(figure, path)


def plot_scaling(
    curves: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, *, title: str
) -> Path:
    """Left: samples/s against workers (log-log), one line per curve, each with its ideal line
    (dotted); right: parallel efficiency (throughput over the ideal)."""
    figure = Figure(figsize=(12, 4.8), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    rate_ax, eff_ax = figure.subplots(1, 2)
    for i, (name, rows) in enumerate(curves.items()):
        colour = f"C{i % 10}"
        workers = [r["workers"] for r in rows]
        rate_ax.plot(workers, [r["samples_per_s"] for r in rows], "o-", color=colour, label=name)
        rate_ax.plot(
            workers, [r["ideal_samples_per_s"] for r in rows], ":", color=colour, alpha=0.8
        )
        eff_ax.plot(workers, [100 * r["efficiency"] for r in rows], "o-", color=colour, label=name)
    rate_ax.plot([], [], ":", color="0.3", label="ideal (linear from the first point)")
    for ax in (rate_ax, eff_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.grid(True, which="major", alpha=0.3)
    rate_ax.set_yscale("log")
    rate_ax.set_ylabel("predicted samples / s")
    eff_ax.set_ylabel("parallel efficiency (%)")
    eff_ax.set_ylim(0, 105)
    rate_ax.legend(fontsize="small")
    figure.suptitle(title, fontweight="bold")
    return _save(figure, path)


def plot_staleness(histogram: Mapping[int, int], path: Path, *, title: str) -> Path:
    """The simulated staleness distribution: how many updates each staleness had."""
    figure = Figure(figsize=(8, 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    keys = sorted(histogram)
    total = sum(histogram.values()) or 1
    ax.bar(keys, [100 * histogram[k] / total for k in keys], width=0.9, color="#4c72b0")
    ax.set_xlabel("staleness (updates applied by others since this worker read the weights)")
    ax.set_ylabel("share of updates (%)")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(figure, path)
