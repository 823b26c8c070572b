"""The communication layer's goals (issue 4), measured with ``tether bench comm`` in one run.

Parts, each one ``tether bench comm`` subprocess whose ``comm.json`` is read back:

1. ``allreduce`` (``--workers`` ranks) and ``allreduce-2`` (2 ranks): every all-reduce algorithm
   and ``native`` (gloo) on this machine, 4 B to 64 MiB. Goal: ``auto`` >= 1.0x native at every
   size (auto may pick native). ``ring`` and ``ring-2``: ring against native alone from 1 MiB,
   with ``--ring-repeats`` (500) repeats. Goal: ring >= 0.8x native at >= 1 MiB, on the mean
   time per call (see ``run_ring``), with a bootstrap interval, medians and lower quartiles.
   ``allgather``: every all-gather algorithm and native, 4 B to 64 MiB (the gathered size) on
   ``--workers`` ranks. Goal: ``auto`` >= 1.0x native at every size, as for all-reduce.
2. ``broadcast``: pipelined chain vs binomial tree (and native) from 1 MiB to 64 MiB on 4 ranks of
   this machine (recorded, no goal: every "link" here is a copy by the same 2 cores), and
   ``broadcast-nodes``: the same on 4 emulated nodes x 1 rank with tbf-capped links. Goal there:
   chain >= 1.5x binomial at >= 16 MiB.
3. ``nodes``: 2 emulated nodes x 2 ranks (network namespaces, each node's link capped with tbf at
   ``--link-mbit``), hierarchical vs flat ring (and native, auto). Goal: hierarchical faster than
   ring at >= 1 MiB. Needs root; skipped with the reason otherwise.
4. ``mpi``: small-message latency of the MPI transport (mpi4py + MPICH) vs gloo, native
   all-reduce on 2 ranks. Goal: MPI <= 0.1x gloo's time at 4 B. Skipped without mpi4py.

"x native" is native's median time divided by the algorithm's (> 1: faster than native), except
in the ring parts, which show means, medians and lower quartiles side by side. Every result is
checked exactly by the benchmark itself; a wrong one fails the run. Writes
``results/comm_<machine>.md`` with the tables, PASS/FAIL per goal, and the plots next to it.

Run from the repository root (about 12 minutes on 2 cores with the default repeats)::

    .venv/bin/python benchmarks/bench_comm.py
    .venv/bin/python benchmarks/bench_comm.py --parts allreduce,mpi --workers 2

Anything below the ``NOTES_MARKER`` line of an existing result file is kept when it is re-run.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from _comm_tables import MiB, bench, by_size, goal, human, sizes, time_table
from _common import ForeignLoad, machine, machine_slug, write_result
from tether.bench.comm_report import mean_ratio_interval
from tether.bench.comm_spec import OPS

PARTS = (
    "allreduce",
    "allreduce-2",
    "ring",
    "ring-2",
    "allgather",
    "broadcast",
    "broadcast-nodes",
    "nodes",
    "mpi",
)


def auto_choices(report: dict[str, Any], workers: int, kind: str) -> dict[int, str]:
    """What ``auto`` ran at each size: the choice of the calibration the run just measured."""
    from tether.comm.calibration.cache import cache_path
    from tether.comm.calibration.model import Calibration
    from tether.launch.env import cache_dir

    # where the run's ranks cached it: the launcher's cache, one node of every rank
    path = cache_path(cache_dir(), "gloo", workers, workers)
    if not path.exists():
        return {}
    calibration = Calibration.from_json(path.read_text())
    return {n: calibration.choose(kind, n) for n in sorted(by_size(report))}


def auto_goals(
    report: dict[str, Any], choices: dict[int, str], workers: int, op: str
) -> list[tuple]:
    """auto against native, separately where auto ran another algorithm (the choice is what is
    tested) and where it ran native itself (the same code: the ratio is the run's noise)."""
    both = {n: row for n, row in by_size(report).items() if "auto" in row and "native" in row}

    def ratio(n: int, key: str = "time_s") -> float:
        return both[n]["native"][key] / both[n]["auto"][key]

    ran_native = {n for n in both if choices.get(n, "native") == "native"}
    other = {n: ratio(n) for n in both if n not in ran_native}
    same = {n: ratio(n) for n in ran_native}
    quartiles = {n: ratio(n, "quartile_s") for n in ran_native}
    goals: list[tuple] = []
    if other:
        worst = min(other, key=lambda n: other[n])
        below = [f"{human(n)} ({choices[n]}, {r:.2f}x)" for n, r in sorted(other.items()) if r < 1]
        goals.append(
            (
                f"{op}: auto >= 1.0x native where auto chose another algorithm ({workers} ranks)",
                not below,
                f"{len(other) - len(below)} of {len(other)} sizes; worst {other[worst]:.2f}x at "
                f"{human(worst)}" + (f"; below: {', '.join(below)}" if below else ""),
            )
        )
    if same:
        spread = f"{min(same.values()):.2f}x to {max(same.values()):.2f}x"
        quartile = f"{min(quartiles.values()):.2f}x to {max(quartiles.values()):.2f}x"
        goals.append(
            (
                f"{op}: auto = native where auto chose native ({workers} ranks; noise check)",
                None,
                f"{len(same)} sizes, measured ratio {spread} (lower quartiles: {quartile}): "
                "the same code timed twice",
            )
        )
    return goals


def run_sweep(
    args: argparse.Namespace, tmp: Path, workers: int, name: str, op: str = "allreduce"
) -> dict[str, Any]:
    """Every algorithm of ``op`` and native, 4 B to 64 MiB, and auto's goal."""
    argv = ["--op", op, "--sizes", sizes(4, 64 * MiB), "--workers", str(workers)]
    argv += ["--repeats", str(args.repeats), "--recalibrate"]  # auto chooses by a fresh one
    report, shown, seconds = bench(argv, tmp / name, args.timeout)
    choices = auto_choices(report, workers, OPS[op])
    goals = auto_goals(report, choices, workers, op)
    picks = ", ".join(f"{human(n)}: {algo}" for n, algo in choices.items())
    table = [*time_table(report), "", f"`auto` ran (from this part's calibration): {picks}"]
    return {"report": report, "command": shown, "seconds": seconds, "goals": goals, "table": table}


def part_allreduce(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    return run_sweep(args, tmp, args.workers, "allreduce")


def part_allreduce_2(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Two ranks, one per core: the same comparison without oversubscription."""
    return run_sweep(args, tmp, 2, "allreduce-2")


def part_allgather(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    return run_sweep(args, tmp, args.workers, "allgather", "allgather")


def run_ring(args: argparse.Namespace, tmp: Path, workers: int, name: str) -> dict[str, Any]:
    """The ring goal on a run of its own: ring and native alone, ``--ring-repeats`` interleaved
    repeats per size (fewer from 4 MiB, the byte budget), judged on the mean time per call, the
    statistic OSU and nccl-tests report. On a noisy VM single calls of 1-4 MiB are bimodal for
    both (about half of them 2-4 ms late): the median of either lands in one mode or the other
    from run to run, while the mean moves only with the share of late calls, which is part of an
    algorithm's cost. Medians and lower quartiles are shown beside it."""
    argv = ["--op", "allreduce", "--algo", "ring,native", "--sizes", sizes(MiB, 64 * MiB)]
    argv += ["--workers", str(workers), "--repeats", str(args.ring_repeats), "--no-predict"]
    report, shown, seconds = bench(argv, tmp / name, args.timeout)
    lines = [
        "| size | repeats | ring us (mean) | native us (mean) | x native, means [95% interval] "
        "| x native, medians | x native, lower quartiles |",
        "|---|---|---|---|---|---|---|",
    ]
    rows, intervals = by_size(report), {}
    for n, row in sorted(rows.items()):
        ring, native = row["ring"], row["native"]
        low, high = intervals[n] = mean_ratio_interval(native["times_s"], ring["times_s"])
        lines.append(
            f"| {human(n)} | {ring['repeats']} | {ring['mean_s'] * 1e6:.0f} | "
            f"{native['mean_s'] * 1e6:.0f} | {ring['vs_native_mean']:.2f} [{low:.2f}-{high:.2f}] "
            f"| {ring['vs_native']:.2f} | {ring['vs_native_quartile']:.2f} |"
        )
    passed, detail = goal(report, "ring", "native", MiB, 0.8, "mean_s")
    worst = min(intervals, key=lambda n: rows[n]["ring"]["vs_native_mean"])
    detail += f"; 95% interval there {intervals[worst][0]:.2f}x-{intervals[worst][1]:.2f}x"
    detail += f"; medians: {goal(report, 'ring', 'native', MiB, 0.8)[1]}"
    detail += f"; lower quartiles: {goal(report, 'ring', 'native', MiB, 0.8, 'quartile_s')[1]}"
    title = f"ring >= 0.8x native at >= 1 MiB ({workers} ranks; mean time per call)"
    return {
        "report": report,
        "command": shown,
        "seconds": seconds,
        "goals": [(title, passed, detail)],
        "table": lines,
    }


def part_ring(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    return run_ring(args, tmp, args.workers, "ring")


def part_ring_2(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    return run_ring(args, tmp, 2, "ring-2")


def part_broadcast(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """On this machine every "link" is a memory copy by the same 2 cores: no pipelining can
    help, so this part is recorded without a goal; the goal is checked on emulated nodes."""
    argv = ["--op", "broadcast", "--algo", "chain,binomial,native", "--sizes"]
    argv += [sizes(MiB, 64 * MiB), "--workers", "4", "--repeats", str(args.repeats)]
    report, shown, seconds = bench(argv, tmp / "broadcast", args.timeout)
    return {"report": report, "command": shown, "seconds": seconds, "goals": []}


def emulated_part(
    args: argparse.Namespace, tmp: Path, name: str, argv: list[str], goal_args: tuple
) -> dict[str, Any]:
    """One ``tether bench comm`` on emulated nodes (links capped at ``--link-mbit``) and its goal
    ``(title, fast, slow, min_bytes, at_least)``; skipped with the reason without namespaces."""
    from tether.launch.netns import available

    reason = available()
    if reason is not None:
        return {"skipped": f"network namespaces unavailable: {reason}"}
    argv = [*argv, "--link-mbit", f"{args.link_mbit:g}", "--repeats", str(args.repeats)]
    report, shown, seconds = bench(argv, tmp / name, args.timeout)
    title, fast, slow, min_bytes, at_least = goal_args
    goals = [(title, *goal(report, fast, slow, min_bytes, at_least))]
    return {"report": report, "command": shown, "seconds": seconds, "goals": goals}


def part_broadcast_nodes(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    argv = ["--op", "broadcast", "--algo", "chain,binomial,native", "--sizes"]
    argv += [sizes(MiB, 64 * MiB), "--workers", "4", "--nodes", "4"]
    title = "chain >= 1.5x binomial at >= 16 MiB (4 emulated nodes x 1 rank)"
    return emulated_part(
        args, tmp, "broadcast-nodes", argv, (title, "chain", "binomial", 16 * MiB, 1.5)
    )


def part_nodes(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    argv = ["--op", "allreduce", "--algo", "ring,hierarchical,native,auto", "--sizes"]
    argv += [sizes(64 * 1024, 64 * MiB), "--workers", "4", "--nodes", "2"]
    title = "hierarchical faster than flat ring at >= 1 MiB (2 nodes x 2 ranks)"
    return emulated_part(args, tmp, "nodes", argv, (title, "hierarchical", "ring", MiB, 1.0))


def part_mpi(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return {"skipped": "mpi4py is not installed (pip install 'tether[mpi]')"}
    common = ["--op", "allreduce", "--algo", "native,ring", "--sizes", "4B,64B,1KB,64KB,1MB"]
    common += ["--workers", "2", "--repeats", str(args.repeats), "--no-predict"]
    gloo, gloo_cmd, s1 = bench([*common, "--transport", "torch"], tmp / "gloo", args.timeout)
    mpi, mpi_cmd, s2 = bench([*common, "--transport", "mpi"], tmp / "mpi", args.timeout)
    lines = ["| size | gloo native us | MPI native us | MPI / gloo | gloo ring us | MPI ring us |"]
    lines.append("|---|---|---|---|---|---|")
    g_rows, m_rows = by_size(gloo), by_size(mpi)
    ratio_4b = None
    for n in sorted(g_rows):
        g, m = g_rows[n], m_rows.get(n, {})
        ratio = m["native"]["time_s"] / g["native"]["time_s"] if "native" in m else None
        if n == 4:
            ratio_4b = ratio
        lines.append(
            f"| {human(n)} | {g['native']['time_s'] * 1e6:.1f} | "
            f"{m['native']['time_s'] * 1e6:.1f} | {ratio:.3f} | "
            f"{g['ring']['time_s'] * 1e6:.1f} | {m['ring']['time_s'] * 1e6:.1f} |"
        )
    passed = ratio_4b is not None and ratio_4b <= 0.1
    detail = f"{ratio_4b:.3f}x at 4 B" if ratio_4b is not None else "4 B not measured"
    return {
        "table": lines,
        "command": f"{gloo_cmd}\n{mpi_cmd}",
        "seconds": s1 + s2,
        "goals": [("MPI native all-reduce <= 0.1x gloo's time at 4 B", passed, detail)],
        "report": mpi,
    }


def write_markdown(
    path: Path, results: dict[str, dict[str, Any]], info: dict[str, str], args, load
) -> None:
    lines = [
        "# Communication layer: our collectives against the backend's (tether bench comm)",
        "",
        f"- Machine: {info['host']}, {info['cpu']}, {info['cores']} cores, torch {info['torch']}, "
        f"Python {info['python']}",
        f"- Date: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}",
        f"- Command: `.venv/bin/python benchmarks/bench_comm.py {shlex.join(sys.argv[1:])}`",
        f"- Other work on the machine during the run: {load[0]:.2f} cores busy on average "
        f"({load[1]})",
        "- Times: median over repeats of the slowest rank's time per call (nccl-tests scheme, "
        "`tether bench comm --help`); `xnative` = native's time / the algorithm's (> 1 is faster); "
        "lower quartiles: the time a quarter of the repeats beat. The ring parts' tables also show "
        "means over repeats, on which the ring goal is judged.",
        "",
        "## Goals",
        "",
        "| goal | result | detail |",
        "|---|---|---|",
    ]
    for part in results.values():
        for name, passed, detail in part.get("goals", []):
            verdict = "info" if passed is None else "PASS" if passed else "FAIL"
            lines.append(f"| {name} | {verdict} | {detail} |")
        if "skipped" in part:
            lines.append(f"| (part skipped) | - | {part['skipped']} |")
    titles = {
        "allreduce": f"All-reduce, {args.workers} ranks on this machine (gloo over loopback)",
        "allreduce-2": "All-reduce, 2 ranks on this machine (one per core)",
        "ring": f"Ring vs native all-reduce, {args.workers} ranks, {args.ring_repeats} repeats "
        "(the ring goal)",
        "ring-2": f"Ring vs native all-reduce, 2 ranks, {args.ring_repeats} repeats (the ring goal)",
        "allgather": f"All-gather, {args.workers} ranks on this machine (gloo over loopback; "
        "size = the gathered output)",
        "broadcast": "Broadcast from rank 0, 4 ranks on this machine (no goal: see the notes)",
        "broadcast-nodes": f"Broadcast from rank 0 on 4 emulated nodes x 1 rank, links capped at "
        f"{args.link_mbit:g} Mbit/s (tbf)",
        "nodes": f"All-reduce on 2 emulated nodes x 2 ranks, node links capped at "
        f"{args.link_mbit:g} Mbit/s (tbf)",
        "mpi": "MPI transport vs gloo, native and ring all-reduce, 2 ranks",
    }
    for key, part in results.items():
        lines += ["", f"## {titles[key]}", ""]
        if "skipped" in part:
            lines += [f"Skipped: {part['skipped']}", ""]
            continue
        lines += [f"`{c}`  " for c in part["command"].splitlines()]
        lines += [f"({part['seconds']:.0f} s)", ""]
        lines += part.get("table") or time_table(part["report"])
        if key != "mpi":
            lines += ["", f"![{key}](comm_{key}_{machine_slug(info)}.png)"]
    lines.append("")
    write_result(path, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"subset of {','.join(PARTS)}")
    parser.add_argument("--workers", type=int, default=4, help="ranks for the allreduce part")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--ring-repeats", type=int, default=500, help="repeats of the ring goal's own run"
    )
    parser.add_argument("--link-mbit", type=float, default=1000.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per part")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; valid: {', '.join(PARTS)}")
    info = machine()
    functions = {
        "allreduce": part_allreduce,
        "allreduce-2": part_allreduce_2,
        "ring": part_ring,
        "ring-2": part_ring_2,
        "allgather": part_allgather,
        "broadcast": part_broadcast,
        "broadcast-nodes": part_broadcast_nodes,
        "nodes": part_nodes,
        "mpi": part_mpi,
    }
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-comm-") as tmp, ForeignLoad() as load:
        for part in parts:
            results[part] = functions[part](args, Path(tmp))
            png = Path(tmp) / part / "comm.png"
            if png.exists():
                args.results.mkdir(parents=True, exist_ok=True)
                shutil.copy(png, args.results / f"comm_{part}_{machine_slug(info)}.png")
        busy = load.cores(), load.top()
    path = args.results / f"comm_{machine_slug(info)}.md"
    write_markdown(path, results, info, args, busy)
    print(f"wrote {path}")
    for part in results.values():
        for name, passed, detail in part.get("goals", []):
            verdict = "info" if passed is None else "PASS" if passed else "FAIL"
            print(f"{verdict}  {name}: {detail}")


if __name__ == "__main__":
    main()
