"""``tether bench comm``: our collective algorithms timed against the backend's own.

In the style of the OSU micro-benchmarks (``osu_allreduce`` and friends: a size sweep, warm-up,
then the average of a timed loop) and of nccl-tests, whose reporting conventions we follow
(nccl-tests ``doc/PERFORMANCE.md``; ALGORITHMS.md section 2):

* ``algbw = bytes / time``, with GB = 1e9 bytes, where bytes is the size of the buffer the
  collective works on (for all-gather, the whole gathered output, as nccl-tests prints it);
* ``busbw = algbw * factor``, the bandwidth each link would carry in an optimal algorithm, so that
  numbers are comparable across operations and rank counts: ``2(P-1)/P`` for all-reduce,
  ``(P-1)/P`` for all-gather and reduce-scatter, ``1`` for broadcast and reduce.

Timing (one scheme, the nccl-tests one, for every algorithm and size): a *repeat* is a barrier,
then ``iters`` back-to-back calls timed together and divided by ``iters`` (several calls for small
messages, so that the skew with which ranks leave the barrier is amortised; one for large ones).
Each rank times its own loop; the time of a repeat is the **maximum over ranks** (a collective is
done when its slowest rank is), and the reported time is the **median over repeats** (robust to
the other tenants of a shared machine). Large messages get fewer repeats so that a default sweep
stays short. Sizes run in the outer loop and algorithms in the inner one, so a slow spell of the
machine hits every algorithm of a size alike and the ``vs native`` ratios stay fair
(DESIGN.md convention 12: ratios measured side by side in one run).

Before it is timed, each algorithm runs once per size on inputs of small integers, whose float32
sums are exact in any order, and its result is compared exactly with the expected one (which is
also native's result): the ``correct`` flag, so a fast wrong algorithm cannot look good.

The per-rank work runs in :mod:`tether.bench.comm_worker`, which any launcher can start (our local
launcher, ``torchrun`` across nodes, ``mpiexec`` for the MPI transport); this module holds the
argument model, the measurement loop, the report (table, JSON, plot) and the local launch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import re
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tether.errors import TetherError, WorkerFailure

if TYPE_CHECKING:  # torch is imported where it is used: `tether --help` need not load it
    import torch

# The --op names (nccl-tests spelling) and the collective kinds of tether.comm.collectives.
OPS = {
    "allreduce": "all_reduce",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "allgather": "all_gather",
}
ROOT = 0  # source of broadcast, destination of reduce
TRANSPORTS = ("torch", "mpi")
ELEMENT_BYTES = 4  # float32, as nccl-tests' default data type
UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
SIZE_SYNTAX = (
    "MIN:MAX (powers of two from MIN to MAX, e.g. 4B:64MB) or a comma list (e.g. 1KB,1MB), "
    "units B, KB, MB, GB (powers of 1024), multiples of 4 bytes (float32)"
)
DEFAULT_SIZES = "4B:64MB"
DEFAULT_REPEATS = 10
DEFAULT_TIMEOUT_S = 600.0
# A repeat times ITER_BYTES worth of calls (at most MAX_ITERS, at least one call); large messages
# get REPEAT_BYTES worth of repeats, but never fewer than MIN_REPEATS.
ITER_BYTES = 256 << 10
MAX_ITERS = 10
REPEAT_BYTES = 64 << 20
MIN_REPEATS = 3
GB = 1e9  # nccl-tests' GB/s are 1e9 bytes per second
# torch's collective timeout and the MPI launcher's deadline exceed the ranks' own deadline by
# this much, so the deadline fires first on every rank and leaves every rank's stacks.
BACKSTOP_S = 30.0


# -- arguments ------------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """``"64MB"`` -> 67108864: an integer and a unit (B, KB, MB, GB: powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise TetherError(f"bad size {text!r} in --sizes; sizes are {SIZE_SYNTAX}")
    n_bytes = int(match.group(1)) * UNITS[(match.group(2) or "B").upper()]
    if n_bytes < ELEMENT_BYTES or n_bytes % ELEMENT_BYTES:
        raise TetherError(f"bad size {text!r} in --sizes; sizes are {SIZE_SYNTAX}")
    return n_bytes


def parse_sizes(spec: str) -> tuple[int, ...]:
    """``"4B:64MB"`` -> 4, 8, 16, ... 64 MiB (doubling from MIN while <= MAX, as nccl-tests'
    ``-b MIN -e MAX -f 2``); ``"1KB,1MB"`` -> those sizes. Ascending, without repeats."""
    if ":" in spec:
        parts = spec.split(":")
        if len(parts) != 2:
            raise TetherError(f"bad --sizes {spec!r}; sizes are {SIZE_SYNTAX}")
        low, high = parse_size(parts[0]), parse_size(parts[1])
        if low > high:
            raise TetherError(f"bad --sizes {spec!r}: {parts[0]} is larger than {parts[1]}")
        sizes = []
        while low <= high:
            sizes.append(low)
            low *= 2
        return tuple(sizes)
    items = [item for item in spec.split(",") if item.strip()]
    if not items:
        raise TetherError(f"bad --sizes {spec!r}; sizes are {SIZE_SYNTAX}")
    return tuple(sorted({parse_size(item) for item in items}))


def format_size(n_bytes: int) -> str:
    """The largest unit that divides ``n_bytes`` exactly, in --sizes syntax (``"64MB"``)."""
    for unit in ("GB", "MB", "KB"):
        if n_bytes >= UNITS[unit] and n_bytes % UNITS[unit] == 0:
            return f"{n_bytes // UNITS[unit]}{unit}"
    return f"{n_bytes}B"


def busbw_factor(kind: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor: what each rank's link carries in an optimal algorithm
    divided by the message size (PERFORMANCE.md)."""
    p = world_size
    if kind == "all_reduce":
        return 2 * (p - 1) / p
    if kind in ("all_gather", "reduce_scatter"):
        return (p - 1) / p
    if kind in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"no bus bandwidth factor for {kind!r}")


def algorithms_for(op: str) -> list[str]:
    """The algorithms that implement ``op``: every registered collective of its kind (native
    included); all-gather has only the backend's own so far."""
    from tether.comm.collectives import collectives_for

    kind = OPS[op]
    return ["native"] if kind == "all_gather" else collectives_for(kind)


@dataclass(frozen=True)
class CommBenchArgs:
    """What to measure. Built by :func:`resolve_args`, which checks every field."""

    op: str
    algos: tuple[str, ...]
    sizes: tuple[int, ...]
    transport: str = "torch"
    backend: str = "auto"
    repeats: int = DEFAULT_REPEATS
    timeout_s: float = DEFAULT_TIMEOUT_S
    predict: bool = True

    @property
    def kind(self) -> str:
        return OPS[self.op]


def resolve_args(
    op: str,
    algos: str | None,
    sizes: str,
    transport: str = "torch",
    backend: str = "auto",
    repeats: int = DEFAULT_REPEATS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    predict: bool = True,
) -> CommBenchArgs:
    """Check the options (one-line :class:`TetherError` on a mistake) and build the args."""
    if op not in OPS:
        raise TetherError(f"unknown --op {op!r}; valid ops: {', '.join(OPS)}")
    if transport not in TRANSPORTS:
        raise TetherError(f"unknown --transport {transport!r}; valid: {', '.join(TRANSPORTS)}")
    if backend not in ("auto", "gloo", "nccl"):
        raise TetherError(f"unknown --backend {backend!r}; valid: auto, gloo, nccl")
    if transport == "mpi" and backend != "auto":
        raise TetherError("--backend applies to --transport torch only (MPI has its own)")
    if repeats < 1:
        raise TetherError("--repeats must be >= 1")
    if not timeout_s > 0:
        raise TetherError("--timeout must be > 0")
    valid = algorithms_for(op)
    if algos is None or algos.strip() in ("", "all"):
        names = tuple(valid)
    else:
        from tether.comm.collectives import COLLECTIVES

        names = tuple(dict.fromkeys(a.strip() for a in algos.split(",") if a.strip()))
        for name in names:
            COLLECTIVES.get(name)  # unknown name: the registry's error lists the valid ones
            if name not in valid:
                extra = " (no algorithm of ours implements it yet)" if op == "allgather" else ""
                raise TetherError(
                    f"collective {name!r} does not implement {op}{extra}; algorithms for "
                    f"{op}: {', '.join(valid)}"
                )
    return CommBenchArgs(
        op, names, parse_sizes(sizes), transport, backend, repeats, timeout_s, predict
    )


def add_bench_options(parser: argparse.ArgumentParser) -> None:
    """The options that ``tether bench comm`` and its worker module share."""
    parser.add_argument(
        "--op",
        default="allreduce",
        help="allreduce | broadcast | reduce | allgather (default allreduce); broadcast and "
        "reduce use root 0; allgather has only the backend's own algorithm (native) so far",
    )
    parser.add_argument(
        "--algo",
        metavar="A,B,...",
        help="algorithms to time, comma-separated (default, or `all`: every algorithm "
        "implementing --op, native included; see the error of an unknown name for the list)",
    )
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"message sizes, {SIZE_SYNTAX} (default {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--transport",
        default="torch",
        help="torch (torch.distributed) | mpi (mpi4py; launched with mpiexec)",
    )
    parser.add_argument(
        "--backend", default="auto", help="torch transport: auto (nccl with CUDA) | gloo | nccl"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help=f"timed repeats per size, median reported (default {DEFAULT_REPEATS}); large "
        f"messages get fewer (about {REPEAT_BYTES >> 20} MiB of calls per size), never under "
        f"{MIN_REPEATS}",
    )
    parser.add_argument(
        "--timeout",
        dest="timeout_s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds the ranks may run (from their start) before they are stopped as hung, "
        f"each leaving its stacks in hang-rankR.txt (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--no-predict",
        dest="predict",
        action="store_false",
        help="no alpha-beta predictions (skips calibrating the transport on first use)",
    )


def args_from_namespace(ns: argparse.Namespace) -> CommBenchArgs:
    return resolve_args(
        ns.op, ns.algo, ns.sizes, ns.transport, ns.backend, ns.repeats, ns.timeout_s, ns.predict
    )


def worker_argv(args: CommBenchArgs, out_file: Path, timeout_s: float) -> list[str]:
    """Options of :mod:`tether.bench.comm_worker` that reproduce ``args``."""
    argv = [
        "--op",
        args.op,
        "--algo",
        ",".join(args.algos),
        "--sizes",
        ",".join(f"{s}B" for s in args.sizes),
        "--transport",
        args.transport,
        "--backend",
        args.backend,
        "--repeats",
        str(args.repeats),
        "--timeout",
        f"{timeout_s:g}",
        "--out",
        str(out_file),
    ]
    return argv if args.predict else [*argv, "--no-predict"]


# -- measurement ----------------------------------------------------------------------------------
def iters_for(n_bytes: int) -> int:
    """Calls per timed repeat: enough to amortise barrier skew for small messages."""
    return max(1, min(MAX_ITERS, ITER_BYTES // n_bytes))


def repeats_for(n_bytes: int, repeats: int) -> int:
    """Timed repeats for a size: ``repeats``, fewer above REPEAT_BYTES of traffic per size (but
    at least MIN_REPEATS, or ``repeats`` if that is smaller)."""
    budget = REPEAT_BYTES // (n_bytes * iters_for(n_bytes))
    return max(min(repeats, MIN_REPEATS), min(repeats, budget))


def pattern(rank: int, n: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s input: small integers (1..13 times rank+1), so float32 sums over any
    realistic number of ranks are exact whatever order an algorithm adds them in."""
    import torch

    base = (torch.arange(n, device=device) % 13 + 1).to(torch.float32)
    return base * (rank + 1)


class Case:
    """The buffers of one (operation, size) on one rank: the input, the buffer the collective
    works in, and the result it must produce."""

    def __init__(
        self, kind: str, n_bytes: int, rank: int, world_size: int, device: torch.device
    ) -> None:
        import torch

        self.kind, self.rank = kind, rank
        n = max(1, n_bytes // ELEMENT_BYTES)
        if kind == "all_gather":
            # nccl-tests' size is the gathered output; each rank contributes 1/P of it.
            per_rank = max(1, n // world_size)
            self.init = pattern(rank, per_rank, device)
            self.buf = self.init.clone()
            self.out = torch.empty(per_rank * world_size, device=device)
            self.expected = torch.cat([pattern(r, per_rank, device) for r in range(world_size)])
        else:
            self.init = pattern(rank, n, device)
            self.buf = self.init.clone()
            self.out = self.buf
            if kind == "broadcast":
                self.expected = pattern(ROOT, n, device)
            else:  # all_reduce, reduce: the sum of every rank's input
                self.expected = pattern(0, n, device) * (world_size * (world_size + 1) // 2)
        self.n_bytes = self.out.numel() * ELEMENT_BYTES

    def reset(self) -> None:
        self.buf.copy_(self.init)

    def check(self) -> bool:
        """The result is exact; a reduce's result is only specified on the root."""
        import torch

        if self.kind == "reduce" and self.rank != ROOT:
            return True
        return bool(torch.equal(self.out, self.expected))


def collective_call(
    kind: str,
    algo: str,
    case: Case,
    transport: Any,
    all_gather: Callable[[torch.Tensor, torch.Tensor], None] | None,
) -> Callable[[], None]:
    """One call of ``algo``'s ``kind`` on the case's buffer, in place."""
    if kind == "all_gather":
        assert all_gather is not None and algo == "native"
        return lambda: all_gather(case.out, case.buf)
    from tether.comm.collectives import COLLECTIVES

    collective = COLLECTIVES.get(algo)
    if kind == "all_reduce":
        return lambda: collective.all_reduce(case.buf, "sum", comm=transport)
    if kind == "broadcast":
        return lambda: collective.broadcast(case.buf, ROOT, comm=transport)
    return lambda: collective.reduce(case.buf, ROOT, "sum", comm=transport)


def measure(
    transport: Any,
    args: CommBenchArgs,
    device: torch.device,
    sync: Callable[[], None] = lambda: None,
    all_gather: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    predict: Callable[[str, str, float], float | None] | None = None,
    progress: TextIO | None = None,
) -> dict[str, Any]:
    """Time every algorithm of ``args`` at every size on ``transport`` (collective: every rank
    calls it). Returns the raw rows (meaningful on rank 0): per algorithm and size the median
    time, the per-repeat times, the correct flag and the prediction."""
    import torch

    rank, world = transport.rank, transport.world_size
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    algos = list(args.algos)
    started = last_note = time.perf_counter()
    transport.barrier()  # NCCL: a plain collective before the first batched point-to-point
    for index, size in enumerate(args.sizes):
        case = Case(args.kind, size, rank, world, device)
        iters, repeats = iters_for(case.n_bytes), repeats_for(case.n_bytes, args.repeats)
        for algo in list(algos):
            now = time.perf_counter()
            if progress is not None and (now - last_note > 2.0 or (index, algo) == (0, algos[0])):
                progress.write(
                    f"tether bench: {format_size(size)} {algo} ({index + 1}/{len(args.sizes)} "
                    f"sizes, {now - started:.0f} s)\n"
                )
                progress.flush()
                last_note = now
            call = collective_call(args.kind, algo, case, transport, all_gather)
            correct, error = _check_once(call, case, sync)
            # Every rank must agree to skip an algorithm (e.g. one that refuses this group size).
            status = torch.tensor([int(error is not None), int(not correct)], device=device)
            transport.all_reduce(status, "max")
            if int(status[0]):
                skipped[algo] = error or "failed on another rank"
                algos.remove(algo)
                continue
            times = _timed_repeats(call, case, transport, sync, iters, repeats + 1)[1:]
            slowest = torch.tensor(times, dtype=torch.float64, device=device)
            transport.all_reduce(slowest, "max")  # a collective ends when its last rank does
            per_repeat = [float(t) for t in slowest.cpu()]
            rows.append(
                {
                    "algo": algo,
                    "bytes": case.n_bytes,
                    "time_s": statistics.median(per_repeat),
                    "times_s": per_repeat,
                    "iters": iters,
                    "repeats": repeats,
                    "correct": not int(status[1]),
                    "predicted_s": (
                        predict(algo, args.kind, case.n_bytes) if predict and rank == 0 else None
                    ),
                }
            )
        del case
    return {"rows": rows, "skipped": skipped, "bench_s": time.perf_counter() - started}


def _check_once(
    call: Callable[[], None], case: Case, sync: Callable[[], None]
) -> tuple[bool, str | None]:
    """One untimed call on the known input: (result exact, refusal message). An algorithm that
    refuses the size or group (a TetherError before anything is sent) is skipped, not failed."""
    case.reset()
    try:
        call()
    except TetherError as exc:
        return False, str(exc)
    sync()
    return case.check(), None


def _timed_repeats(
    call: Callable[[], None],
    case: Case,
    transport: Any,
    sync: Callable[[], None],
    iters: int,
    repeats: int,
) -> list[float]:
    """This rank's seconds per call in each repeat (the first repeat is the warm-up). The buffer
    is reset outside the timed region so that repeated in-place sums cannot overflow."""
    times = []
    for _ in range(repeats):
        case.reset()
        sync()
        transport.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        sync()
        times.append((time.perf_counter() - start) / iters)
    return times


# -- report ---------------------------------------------------------------------------------------
def finish_report(raw: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The raw rows of :func:`measure` with algbw, busbw and the ratio to native added.

    ``vs_native`` is native's time over the algorithm's (above 1: faster than native); it is
    left empty for an algorithm whose result was wrong, so a fast wrong one never ranks well."""
    kind, world = OPS[meta["op"]], int(meta["workers"])
    factor = busbw_factor(kind, world)
    native = {r["bytes"]: r["time_s"] for r in raw["rows"] if r["algo"] == "native"}
    rows = []
    for row in raw["rows"]:
        time_s = float(row["time_s"])
        algbw = row["bytes"] / time_s / GB if time_s > 0 else math.inf
        reference = native.get(row["bytes"])
        vs_native = reference / time_s if reference and row["correct"] and time_s > 0 else None
        rows.append(
            {**row, "algbw_GBps": algbw, "busbw_GBps": algbw * factor, "vs_native": vs_native}
        )
    return {
        **meta,
        "kind": kind,
        "busbw_factor": factor,
        "timing": (
            "per repeat: barrier, then `iters` back-to-back calls timed and divided by iters; "
            "time of a repeat = max over ranks; time_s = median over repeats (first repeat "
            "discarded as warm-up)"
        ),
        "units": {"time_s": "seconds", "algbw_GBps": "1e9 bytes/s", "busbw_GBps": "1e9 bytes/s"},
        "skipped": raw.get("skipped", {}),
        "bench_s": raw.get("bench_s"),
        "rows": rows,
    }


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


# -- local launch ---------------------------------------------------------------------------------
WORKER_MODULE = "tether.bench.comm_worker"


def hang_file(out_file: Path, rank: int) -> Path:
    """Where a rank's stacks go when its deadline passes (faulthandler)."""
    return out_file.parent / f"hang-rank{rank}.txt"


def launch_torch(workers: int, argv: Sequence[str], timeout_s: float, run_dir: Path) -> None:
    """Run ``workers`` processes of the worker module with the local elastic launcher (the engine
    behind torchrun: c10d rendezvous on 127.0.0.1, no restarts, so a failed rank stops the rest).

    Each worker arms a deadline (faulthandler: a C thread that dumps every stack and exits even if
    the rank is stuck in a collective), so a hung rank ends the run near ``timeout_s``."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from tether.launch.env import prepare_local_environment
    from tether.launch.local import describe_failures, free_port

    prepare_local_environment()
    for name in ("torch.distributed.elastic", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=workers,
        run_id=f"tether-bench-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        local_addr="127.0.0.1",
    )
    try:
        elastic_launch(launch, sys.executable)("-m", WORKER_MODULE, *argv)
    except ChildFailedError as error:
        message, ranks = describe_failures(error, run_dir / "failures.log")
        raise WorkerFailure(_hung_ranks(run_dir, timeout_s) or message, ranks) from None
    except SignalException as stop:  # we were told to stop (Ctrl-C, kill): so were the ranks
        if stop.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise WorkerFailure(
            f"stopped by {stop.sigval.name}; the workers were stopped", []
        ) from None
    finally:
        _remove_empty_hang_files(run_dir)


def _hung_ranks(run_dir: Path, timeout_s: float) -> str:
    """The one-line error of a run stopped by the ranks' deadline, or "" if it was not."""
    hung = sorted(p.name for p in run_dir.glob("hang-*.txt") if p.stat().st_size)
    if not hung:
        return ""
    return (
        f"the benchmark did not finish within --timeout {timeout_s:g} s (a hung rank?); the "
        f"ranks' stacks are in {run_dir}/{{{','.join(hung)}}}"
    )


def _remove_empty_hang_files(run_dir: Path) -> None:
    """A rank killed by the launcher (after another failed) leaves its deadline file empty."""
    for stale in run_dir.glob("hang-*.txt"):
        if not stale.stat().st_size:
            stale.unlink(missing_ok=True)


def launch_mpi(workers: int, argv: Sequence[str], timeout_s: float, run_dir: Path) -> None:
    """Run the worker module on ``workers`` MPI ranks through :func:`tether.launch.mpi.run_mpi`
    (which kills the whole process tree past its deadline). The ranks' output is captured into
    ``run_dir/mpi.log``."""
    import subprocess

    try:
        from tether.launch.mpi import run_mpi
    except ImportError:
        raise TetherError(
            "--transport mpi needs tether.launch.mpi, which this version lacks; use --transport torch"
        ) from None
    command = [sys.executable, "-m", WORKER_MODULE, *argv]
    try:
        # The ranks' own deadline fires first and leaves their stacks; this one is the backstop.
        result = run_mpi(workers, command, timeout_s + BACKSTOP_S)
    except subprocess.TimeoutExpired as expired:
        _write_log(run_dir / "mpi.log", expired.output, expired.stderr)
        raise WorkerFailure(
            f"the benchmark did not finish within --timeout {timeout_s:g} s; mpiexec was "
            f"stopped (output in {run_dir / 'mpi.log'})",
            [],
        ) from None
    _write_log(run_dir / "mpi.log", result.stdout, result.stderr)
    if result.returncode != 0:
        hung = _hung_ranks(run_dir, timeout_s)
        _remove_empty_hang_files(run_dir)
        lines = [line for line in (result.stderr or "").splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else "no message"
        raise WorkerFailure(
            hung
            or f"mpiexec exited with code {result.returncode}: {reason} (output in "
            f"{run_dir / 'mpi.log'})",
            [],
        )


def _write_log(path: Path, stdout: str | bytes | None, stderr: str | bytes | None) -> None:
    def text(value: str | bytes | None) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else value or ""

    path.write_text(f"== stdout ==\n{text(stdout)}\n== stderr ==\n{text(stderr)}")


def run_comm_bench(
    args: CommBenchArgs,
    workers: int,
    out_dir: Path,
    command: str = "",
    stdout: TextIO = sys.stdout,
    nodes: int = 1,
    link_mbit: float | None = None,
) -> dict[str, Any]:
    """Launch ``workers`` local ranks (on ``nodes`` emulated nodes whose links are capped at
    ``link_mbit`` when given), then print the table and write ``out_dir/comm.json`` and
    ``out_dir/comm.png``. Returns the report."""
    from tether.bench.emulated import check_nodes, launch_emulated

    if workers < 2:
        raise TetherError("--workers must be >= 2 (a collective needs several ranks)")
    check_nodes(workers, nodes, link_mbit)
    if nodes > 1 and args.transport != "torch":
        raise TetherError("--nodes runs torchrun across emulated nodes: use --transport torch")
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file = out_dir / "comm.json"
    out_file.unlink(missing_ok=True)
    argv = worker_argv(args, out_file, args.timeout_s)
    print(
        f"tether: bench comm {args.op} on {workers} workers ({args.transport}), "
        f"{len(args.algos)} algorithms x {len(args.sizes)} sizes, output in {out_dir}",
        file=sys.stderr,
    )
    if args.transport == "mpi":
        launch_mpi(workers, argv, args.timeout_s, out_dir)
    elif nodes > 1:
        launch_emulated(workers, nodes, link_mbit, WORKER_MODULE, argv, args.timeout_s, out_dir)
    else:
        launch_torch(workers, argv, args.timeout_s, out_dir)
    if not out_file.exists():
        raise WorkerFailure(f"the workers finished without writing {out_file}", [])
    report = json.loads(out_file.read_text())
    report["command"] = command
    report["nodes"] = nodes
    report["link_mbit"] = link_mbit
    from tether.observe.files import atomic_write_json

    atomic_write_json(out_file, report)
    plot_report(report, out_dir / "comm.png")
    print(format_table(report), file=stdout)
    return report


def default_out_dir() -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"bench-comm-{stamp}"
