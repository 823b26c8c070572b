"""The pieces of benchmarks/bench_comm.py that read ``tether bench comm`` reports: running one,
the size lists, the tables of times and ratios, and the goal checks."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import tether_command

MiB = 1 << 20


def sizes(low: int, high: int, factor: int = 4) -> str:
    out, n = [], low
    while n <= high:
        out.append(f"{n}B")
        n *= factor
    return ",".join(out)


def bench(argv: list[str], out: Path, timeout_s: float) -> tuple[dict[str, Any], str, float]:
    """Run ``tether bench comm ARGV --out OUT``; returns the report, the command and seconds."""
    command = [*tether_command(), "bench", "comm", *argv, "--out", str(out)]
    shown = "tether bench comm " + shlex.join(argv)
    print(f"$ {shown}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    seconds = time.perf_counter() - start
    print(done.stdout, flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"{shown} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads((out / "comm.json").read_text()), shown, seconds


def by_size(report: dict[str, Any]) -> dict[int, dict[str, dict[str, Any]]]:
    table: dict[int, dict[str, dict[str, Any]]] = {}
    for row in report["rows"]:
        table.setdefault(row["bytes"], {})[row["algo"]] = row
    return table


def human(n: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def time_table(report: dict[str, Any], reference: str = "native") -> list[str]:
    """Median time per call (us) per algorithm and size, and each one's speed relative to
    ``reference`` (reference time / its time)."""
    rows = by_size(report)
    algos = list(dict.fromkeys(r["algo"] for r in report["rows"]))
    head = "| size | " + " | ".join(f"{a} us" for a in algos) + " | "
    head += " | ".join(f"{a} x{reference}" for a in algos if a != reference) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(algos) - 1)]
    for n, row in sorted(rows.items()):
        ref = row.get(reference)
        cells = [f"{row[a]['time_s'] * 1e6:.0f}" if a in row else "-" for a in algos]
        ratios = [
            f"{ref['time_s'] / row[a]['time_s']:.2f}" if ref and a in row else "-"
            for a in algos
            if a != reference
        ]
        lines.append(f"| {human(n)} | " + " | ".join(cells + ratios) + " |")
    return lines


def goal(
    report: dict[str, Any],
    fast: str,
    slow: str,
    min_bytes: int,
    at_least: float,
    key: str = "time_s",
) -> tuple[bool, str]:
    """PASS when ``slow``'s time / ``fast``'s time >= ``at_least`` at every size >= min_bytes
    (``key``: ``time_s``, the median over repeats, ``quartile_s``, their lower quartile, or
    ``mean_s``, their mean). Returns (passed, a line with the worst ratio and the failing
    sizes)."""
    ratios = [
        (row[slow][key] / row[fast][key], n)
        for n, row in sorted(by_size(report).items())
        if n >= min_bytes and fast in row and slow in row
    ]
    if not ratios:
        return False, "no sizes measured"
    worst, at = min(ratios)
    passed = worst >= at_least
    failing = [human(n) for r, n in ratios if r < at_least]
    detail = f"worst {worst:.2f}x at {human(at)}"
    if failing:
        detail += f"; below {at_least}x at {', '.join(failing)}"
    return passed, detail
