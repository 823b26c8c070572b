"""The report of ``tether bench comm``: algbw/busbw and ratios to native, the table, the plot."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.bench.comm_spec import GB, OPS, busbw_factor, format_size

if TYPE_CHECKING:  # torch is imported where it is used: `tether --help` need not load it
    pass


def finish_report(raw: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The raw rows of :func:`measure` with algbw, busbw and the ratio to native added.

    ``vs_native`` is native's time over the algorithm's (above 1: faster than native),
    ``vs_native_quartile`` and ``vs_native_mean`` the same for the lower quartiles and the means;
    all are left empty for an algorithm whose result was wrong, so a fast wrong one never ranks
    well."""
    kind, world = OPS[meta["op"]], int(meta["workers"])
    factor = busbw_factor(kind, world)
    native = {r["bytes"]: r for r in raw["rows"] if r["algo"] == "native"}
    rows = []
    for row in raw["rows"]:
        time_s = float(row["time_s"])
        algbw = row["bytes"] / time_s / GB if time_s > 0 else math.inf
        reference = native.get(row["bytes"]) if row["correct"] else None
        rows.append(
            {
                **row,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * factor,
                "vs_native": _ratio(reference, row, "time_s"),
                "vs_native_quartile": _ratio(reference, row, "quartile_s"),
                "vs_native_mean": _ratio(reference, row, "mean_s"),
            }
        )
    return {
        **meta,
        "kind": kind,
        "busbw_factor": factor,
        "timing": (
            "per repeat: barrier, then `iters` back-to-back calls timed and divided by iters; "
            "time of a repeat = max over ranks; time_s = median over repeats, quartile_s = "
            "lower quartile, mean_s = mean (first repeat discarded as warm-up)"
        ),
        "units": {
            "time_s": "seconds",
            "quartile_s": "seconds",
            "mean_s": "seconds",
            "algbw_GBps": "1e9 bytes/s",
            "busbw_GBps": "1e9 bytes/s",
        },
        "skipped": raw.get("skipped", {}),
        "bench_s": raw.get("bench_s"),
        "rows": rows,
    }


def _ratio(native: dict[str, Any] | None, row: dict[str, Any], key: str) -> float | None:
    """native's ``key`` time over the row's; None without a native row or a time."""
    if native is None or key not in row or not row[key] > 0:
        return None
    return float(native[key]) / float(row[key])


def mean_ratio_interval(
    reference: list[float],
    times: list[float],
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """A percentile-bootstrap interval (Efron and Tibshirani, *An Introduction to the Bootstrap*,
    1993, ch. 13) for ``mean(reference) / mean(times)``: how far the ratio of two algorithms'
    mean times could move if the same run were repeated. The repeats were measured in pairs
    (repeat i of every algorithm in the same interleaved round), so they are resampled in pairs:
    a slow spell of the machine stays in both means, as it was."""
    if len(reference) != len(times) or not times:
        raise ValueError(
            f"needs the same number of paired repeats, got {len(reference)} and {len(times)}"
        )
    draw = random.Random(seed)
    n = len(times)
    ratios = []
    for _ in range(resamples):
        picks = draw.choices(range(n), k=n)
        ratios.append(sum(reference[i] for i in picks) / sum(times[i] for i in picks))
    ratios.sort()
    tail = (1.0 - level) / 2.0
    return ratios[int(tail * (resamples - 1))], ratios[int((1.0 - tail) * (resamples - 1))]


TABLE_COLUMNS = (
    ("size", "<", 7),
    ("algo", "<", 18),
    ("time_us", ">", 11),
    ("algbw GB/s", ">", 11),
    ("busbw GB/s", ">", 11),
    ("pred_us", ">", 11),
    ("vs native", ">", 10),
    ("correct", "<", 7),
)


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"
    return f"{value:.{digits - 1}e}"


def format_table(report: dict[str, Any]) -> str:
    """The report as a fixed-width table, one line per (size, algorithm), sizes ascending."""
    header = " ".join(f"{name:{align}{width}}" for name, align, width in TABLE_COLUMNS)
    lines = [header.rstrip()]
    for row in report["rows"]:
        predicted = row.get("predicted_s")
        cells = (
            format_size(row["bytes"]),
            row["algo"],
            _number(row["time_s"] * 1e6, 4),
            _number(row["algbw_GBps"]),
            _number(row["busbw_GBps"]),
            _number(predicted * 1e6 if predicted is not None else None, 4),
            f"{row['vs_native']:.2f}" if row.get("vs_native") is not None else "-",
            "yes" if row["correct"] else "WRONG",
        )
        lines.append(
            " ".join(
                f"{cell:{align}{width}}"
                for cell, (_, align, width) in zip(cells, TABLE_COLUMNS, strict=True)
            ).rstrip()
        )
    lines.append("vs native: native's time over the algorithm's (above 1: faster than native)")
    for algo, reason in report.get("skipped", {}).items():
        lines.append(f"skipped {algo}: {reason}")
    return "\n".join(lines)


def plot_report(report: dict[str, Any], path: Path) -> None:
    """Two log-log panels, time and bus bandwidth against size, one colour per algorithm:
    measured solid, alpha-beta prediction dashed; a wrong result is a red cross."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    from tether.observe.files import atomic_write

    figure = Figure(figsize=(12, 4.8))
    FigureCanvasAgg(figure)
    time_ax, bw_ax = figure.subplots(1, 2)
    algos = list(dict.fromkeys(row["algo"] for row in report["rows"]))
    for index, algo in enumerate(algos):
        colour = f"C{index % 10}"
        rows = [r for r in report["rows"] if r["algo"] == algo]
        sizes = [r["bytes"] for r in rows]
        time_ax.plot(sizes, [r["time_s"] * 1e6 for r in rows], "-o", ms=3, color=colour, label=algo)
        bw_ax.plot(sizes, [r["busbw_GBps"] for r in rows], "-o", ms=3, color=colour, label=algo)
        predicted = [(r["bytes"], r["predicted_s"]) for r in rows if r.get("predicted_s")]
        if predicted:
            xs = [x for x, _ in predicted]
            time_ax.plot(xs, [t * 1e6 for _, t in predicted], "--", color=colour, alpha=0.7)
            factor = report["busbw_factor"]
            bw_ax.plot(
                xs, [x / t / GB * factor for x, t in predicted], "--", color=colour, alpha=0.7
            )
        wrong = [r for r in rows if not r["correct"]]
        for ax, key in ((time_ax, "time_s"), (bw_ax, "busbw_GBps")):
            scale = 1e6 if key == "time_s" else 1.0
            ax.plot(
                [r["bytes"] for r in wrong],
                [r[key] * scale for r in wrong],
                "x",
                color="red",
                ms=8,
                mew=2,
            )
    if any(not r["correct"] for r in report["rows"]):
        time_ax.plot([], [], "x", color="red", ms=8, mew=2, label="wrong result")
    if any(r.get("predicted_s") for r in report["rows"]):
        time_ax.plot([], [], "--", color="0.4", label="alpha-beta prediction")
    size_format = FuncFormatter(lambda x, _: format_size(int(x)) if x >= 1 else "")
    for ax, label in ((time_ax, "time per call (µs)"), (bw_ax, "bus bandwidth (GB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=4))
        ax.xaxis.set_major_formatter(size_format)
        ax.set_xlabel("message size")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    time_ax.legend(fontsize=8)
    date = str(report.get("date", "")).replace("T", " ").replace("+00:00", " UTC")
    figure.suptitle(
        f"{report['op']} on {report['workers']} ranks ({report['transport']}/"
        f"{report.get('backend', '')}), {report.get('host', '')}, {date}",
        fontsize=10,
    )
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    atomic_write(path, lambda handle: handle.write(buffer.getvalue()))


def wrong_results(report: dict[str, Any]) -> list[str]:
    """``"ring at 4KB"`` for every row whose result was wrong."""
    return [f"{r['algo']} at {format_size(r['bytes'])}" for r in report["rows"] if not r["correct"]]
