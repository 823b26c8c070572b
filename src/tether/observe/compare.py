"""The rows of a method comparison and the files that hold them: ``compare.json``, ``compare.md``.

A row is a plain JSON-ready dict built from one run's ``summary.json`` (or from the error that
ended the run), so that ``compare.json`` alone is enough to redraw the figure or re-make the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether.observe.files import atomic_write_json, atomic_write_text
from tether.observe.summary import lost_worker_text

# When the user gives no --target-accuracy, "time to target" means time to this test accuracy.
DEFAULT_TARGET = 0.85

Row = dict[str, Any]
# Every row has these keys (a failed run's numbers are null).
ROW_FIELDS = (
    "method",
    "status",
    "error",
    "run_dir",
    "workers",
    "time_to_target_s",
    "final_test_accuracy",
    "final_test_loss",
    "samples_per_s",
    "comm_fraction",
    "rounds",
    "steps",
    "wall_time_s",
    "time_split_s",
    "lost_workers",
    "settings",
    "history",
)


def time_to_target(summary: dict[str, Any], target: float) -> float | None:
    """Seconds until the test accuracy first reached ``target``, or None if it never did.

    The run's own ``time_to_target_s`` is used when it was timed against the same target;
    otherwise the first evaluation in ``history`` at or above ``target`` gives the time.
    """
    if summary.get("target_accuracy") == target and "time_to_target_s" in summary:
        value = summary["time_to_target_s"]
        return None if value is None else float(value)
    for entry in summary.get("history", []):
        if entry.get("test_accuracy") is not None and entry["test_accuracy"] >= target:
            return float(entry["time_s"])
    return None


def row_from_summary(summary: dict[str, Any], target: float, run_dir: Path | str) -> Row:
    """One comparison row from a finished run's summary (see the run directory contract in README.md)."""
    return {
        "method": summary["method"],
        "status": "ok",
        "error": None,
        "run_dir": str(run_dir),
        "workers": summary.get("workers"),
        "time_to_target_s": time_to_target(summary, target),
        "final_test_accuracy": summary.get("final_test_accuracy"),
        "final_test_loss": summary.get("final_test_loss"),
        "samples_per_s": summary.get("samples_per_s"),
        "comm_fraction": summary.get("comm_fraction"),
        "rounds": summary.get("rounds", summary.get("steps")),
        "steps": summary.get("steps"),
        "wall_time_s": summary.get("wall_time_s"),
        "time_split_s": summary.get("time_split_s"),
        "lost_workers": list(summary.get("lost_workers") or []),
        "settings": _with_alpha(summary),
        "history": [  # a run of a model whose accuracy is not measured has no curve
            {"time_s": h["time_s"], "step": h.get("step"), "test_accuracy": h["test_accuracy"]}
            for h in summary.get("history", [])
            if h.get("test_accuracy") is not None
        ],
    }


def _with_alpha(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The run's settings, with the elastic rate the method computed when none was set."""
    settings = summary.get("settings")
    if settings is None or summary.get("alpha") is None or "alpha" in settings:
        return settings
    return {**settings, "alpha": summary["alpha"]}


def failed_row(method: str, error: str, run_dir: Path | str) -> Row:
    """A row for a method whose run failed; ``error`` is the one-line reason."""
    row: Row = dict.fromkeys(ROW_FIELDS)
    row.update(method=method, status="failed", error=error, run_dir=str(run_dir))
    row.update(history=[], lost_workers=[])
    return row


def _cell(text: str) -> str:
    """Make ``text`` safe inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _num(value: Any, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _seconds(value: float) -> str:
    """Seconds to the hundredth below 10 s (0.44 and 0.31 s were both "0.4" and "0.3")."""
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def markdown_table(rows: Sequence[Row], target: float) -> str:
    """The comparison table, one line per method, in the order the methods ran."""
    header = (
        f"| method | time to {target:.0%} (s) | final accuracy | samples/s | comm share "
        "| rounds | wall time (s) | settings | note |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for row in rows:
        if row["status"] != "ok":
            cells = ["–"] * 7 + [_cell(f"failed: {row['error']}")]
        else:
            reached = row["time_to_target_s"]
            lost = row.get("lost_workers") or []
            cells = [
                "not reached" if reached is None else _seconds(reached),
                _num(row["final_test_accuracy"], ".2%"),
                _num(row["samples_per_s"], ".0f"),
                _num(row["comm_fraction"], ".1%"),
                _num(row["rounds"], "d"),
                "–" if row["wall_time_s"] is None else _seconds(row["wall_time_s"]),
                _cell(settings_text(row.get("settings"))),
                _cell("lost workers: " + ", ".join(map(lost_worker_text, lost))) if lost else "",
            ]
        lines.append("| " + " | ".join([_cell(row["method"]), *cells]) + " |")
    return "\n".join(lines)


def settings_text(settings: dict[str, Any] | None) -> str:
    """A row's own settings, e.g. ``lr 0.4, batch 64, tau 1, alpha 0.225``."""
    if not settings:
        return "–"
    names = {"batch_size": "batch", "lr_schedule": "schedule", "warmup_steps": "warm-up steps"}
    names |= {"clip_grad_norm": "clip"}
    return ", ".join(
        f"{names.get(key, key)} {value:g}"
        if isinstance(value, float)
        else f"{names.get(key, key)} {value}"
        for key, value in settings.items()
    )


def settings_line(settings: dict[str, Any]) -> str:
    """One sentence naming what every method shared, the target, and the date."""
    length = (
        f"{settings['steps']} steps"
        if settings.get("steps") is not None
        else f"{settings['epochs']} epoch{'s' if settings['epochs'] != 1 else ''}"
    )
    target = f"target accuracy {settings['target_accuracy']:.0%}"
    if settings.get("target_is_default"):
        target += " (comparison default; set --target-accuracy to change it)"
    groups = int(settings.get("model_parallel") or 1)  # a model group takes one batch
    workers = f"{settings['workers']} workers" + (
        f" in model groups of {groups}" if groups > 1 else ""
    )
    batch = settings["batch_size"]
    if batch is None:  # the methods ran with different batches
        batch_text = "each method's batch in its row"
    else:
        batch_text = f"batch {batch} per worker ({batch * settings['workers'] // groups} global)"
    return (
        f"Settings: model {settings['model']}, dataset {settings['dataset']}, "
        f"{workers}, {batch_text}, {length}, "
        f"seed {settings['seed']} (each method's own settings in its row); {target}. "
        f"Date: {settings['date']}."
    )


def render_markdown(rows: Sequence[Row], settings: dict[str, Any], figure: str | None) -> str:
    """The whole of ``compare.md``: title, settings line, table, and the figure if there is one."""
    title = (
        f"# Method comparison: {settings['model']} / {settings['dataset']}, "
        f"{settings['workers']} workers"
    )
    parts = [title, settings_line(settings), markdown_table(rows, settings["target_accuracy"])]
    parts.append(
        "Comm share: communication not hidden behind computation, as a share of worker time. "
        "Rounds: communication rounds where the method counts them, else optimizer steps."
    )
    if figure:
        parts.append(
            f"![test accuracy against training time (evaluation pauses left out), and where the time went]({figure})"
        )
    return "\n\n".join(parts) + "\n"


def write_comparison(
    out: Path, rows: Sequence[Row], settings: dict[str, Any], figure: str | None = "compare.png"
) -> tuple[Path, Path]:
    """Write ``out/compare.json`` and ``out/compare.md``; return their paths."""
    json_path, md_path = out / "compare.json", out / "compare.md"
    atomic_write_json(json_path, {"settings": settings, "rows": list(rows)})
    atomic_write_text(md_path, render_markdown(rows, settings, figure))
    return json_path, md_path
