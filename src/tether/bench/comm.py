"""``tether bench comm``: our collective algorithms timed against the backend's own.

In the style of the OSU micro-benchmarks (``osu_allreduce`` and friends: a size sweep, warm-up,
then the average of a timed loop) and of nccl-tests, whose reporting conventions we follow
(nccl-tests ``doc/PERFORMANCE.md``; docs/communication.md):

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
stays short. Sizes run in the outer loop, and at each size the repeats are interleaved across the
algorithms (repeat 1 of every algorithm, then repeat 2, ...), so a slow spell of the machine hits
every algorithm of a size alike and the ``vs native`` ratios stay fair (
ratios measured side by side in one run).

Before it is timed, each algorithm runs once per size on inputs of small integers, whose float32
sums are exact in any order, and its result is compared exactly with the expected one (which is
also native's result): the ``correct`` flag, so a fast wrong algorithm cannot look good.

The per-rank work runs in :mod:`tether.bench.comm_worker`, which any launcher can start (our local
launcher, ``torchrun`` across nodes, ``mpiexec`` for the MPI transport); this module holds the
argument model and runs the benchmark; :mod:`~tether.bench.comm_measure` measures,
:mod:`~tether.bench.comm_report` reports (table, JSON, plot), :mod:`~tether.bench.comm_launch`
starts the ranks; :mod:`~tether.bench.comm_spec` holds the conventions they share.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tether.bench.comm_spec import ELEMENT_BYTES, OPS, UNITS
from tether.errors import TetherError, WorkerFailure
from tether.run_names import run_stamp

if TYPE_CHECKING:  # torch is imported where it is used: `tether --help` need not load it
    pass

TRANSPORTS = ("torch", "mpi")
SIZE_SYNTAX = (
    "MIN:MAX (powers of two from MIN to MAX, e.g. 4B:64MB) or a comma list (e.g. 1KB,1MB), "
    "units B, KB, MB, GB (powers of 1024), multiples of 4 bytes (float32)"
)
DEFAULT_SIZES = "4B:64MB"
DEFAULT_REPEATS = 10
DEFAULT_TIMEOUT_S = 600.0
# A repeat times tether.comm.calibration.rounds.iters_for calls back to back; large messages get
# REPEAT_BYTES worth of repeats, but never fewer than MIN_REPEATS. From 1 MiB a repeat is a
# single call, and on a loaded or oversubscribed machine single calls of gloo's point-to-point
# are bimodal (some 2-3x the typical time): a median of 3-4 repeats, what 64 MiB per size gave
# at 16 MiB, swung the 2-rank ring from 0.8x to 1.0x native between runs of the same code.
REPEAT_BYTES = 512 << 20
MIN_REPEATS = 3
MAX_REPEATS = 10**6
MAX_WORKERS = 4096
# Buffers of the largest size a rank holds at once (input, output, the algorithm's scratch and
# the reference result): for the memory check before launch.
BUFFERS_PER_RANK = 4


# -- arguments ------------------------------------------------------------------------------------
def check_memory(workers: int, largest: int) -> None:
    """Every local rank holds BUFFERS_PER_RANK buffers of the largest size: refuse sizes that
    cannot fit in this machine's available memory before any rank starts."""
    available = available_memory_bytes()
    need = workers * largest * BUFFERS_PER_RANK
    if available is not None and need > available:
        raise TetherError(
            f"--sizes up to {largest / 2**20:.0f} MiB on {workers} ranks needs about "
            f"{need / 2**30:.1f} GiB; this machine has {available / 2**30:.1f} GiB available: "
            "lower the largest size"
        )


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


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


def algorithms_for(op: str) -> list[str]:
    """The algorithms that implement ``op``: every registered collective of its kind (native
    included)."""
    from tether.comm.collectives import collectives_for

    return collectives_for(OPS[op])


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
    recalibrate: bool = False
    pin: bool = False
    quiet: bool = False  # no progress lines

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
    recalibrate: bool = False,
    pin: bool = False,
    quiet: bool = False,
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
    if not 1 <= repeats <= MAX_REPEATS:
        raise TetherError(f"--repeats must be in 1..{MAX_REPEATS}, got {repeats}")
    if not (math.isfinite(timeout_s) and timeout_s >= 1):
        raise TetherError(f"--timeout must be a finite number of seconds >= 1, got {timeout_s}")
    valid = algorithms_for(op)
    if algos is None or algos.strip() in ("", "all"):
        names = tuple(valid)
    else:
        from tether.comm.collectives import COLLECTIVES

        names = tuple(dict.fromkeys(a.strip() for a in algos.split(",") if a.strip()))
        if not names:  # "," named none (the worker then timed every one)
            raise TetherError(
                f"--algo {algos!r} names no algorithm; algorithms for {op}: {', '.join(valid)}"
            )
        for name in names:
            COLLECTIVES.get(name)  # unknown name: the registry's error lists the valid ones
            if name not in valid:
                raise TetherError(
                    f"collective {name!r} does not implement {op}; algorithms for "
                    f"{op}: {', '.join(valid)}"
                )
    return CommBenchArgs(
        op,
        names,
        parse_sizes(sizes),
        transport,
        backend,
        repeats,
        timeout_s,
        predict,
        recalibrate,
        pin,
        quiet,
    )


def add_bench_options(parser: argparse.ArgumentParser) -> None:
    """The options that ``tether bench comm`` and its worker module share."""
    parser.add_argument(
        "--op",
        default="allreduce",
        help="allreduce | broadcast | reduce | allgather (default allreduce); broadcast and "
        "reduce use root 0; allgather's size is the gathered output, 1/P of it from each rank",
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
        "--backend",
        default="auto",
        help="torch transport: auto (nccl with a GPU for each rank) | gloo | nccl",
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
    parser.add_argument(
        "--recalibrate",
        action="store_true",
        help="measure the calibration (predictions, auto's choices) again instead of using the "
        "cached one, e.g. after the machine or its load changed",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress lines on stderr (the sizes and algorithms as they are timed)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin each rank's main thread to one core (its local rank mod the cores), as MPI "
        "benchmarks bind ranks; the backend's threads stay free (default: unpinned)",
    )


def args_from_namespace(ns: argparse.Namespace) -> CommBenchArgs:
    return resolve_args(
        ns.op,
        ns.algo,
        ns.sizes,
        ns.transport,
        ns.backend,
        ns.repeats,
        ns.timeout_s,
        ns.predict,
        ns.recalibrate,
        ns.pin,
        ns.quiet,
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
    argv += [] if args.predict else ["--no-predict"]
    argv += ["--pin"] if args.pin else []
    argv += ["--quiet"] if args.quiet else []
    return argv + (["--recalibrate"] if args.recalibrate else [])


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
    from tether.bench.comm_launch import WORKER_MODULE, launch_mpi, launch_torch
    from tether.bench.comm_report import format_table, plot_report
    from tether.bench.emulated import check_nodes, launch_emulated

    if workers < 2:
        raise TetherError("--workers must be >= 2 (a collective needs several ranks)")
    if workers > MAX_WORKERS:
        raise TetherError(f"--workers must be <= {MAX_WORKERS}, got {workers}")
    check_nodes(workers, nodes, link_mbit)
    check_memory(workers, max(args.sizes))
    if args.transport == "torch":
        from tether.launch.worker import resolve_backend

        resolve_backend(args.backend, workers // max(nodes, 1))  # nccl needs a GPU per rank
    if nodes > 1 and args.transport != "torch":
        raise TetherError("--nodes runs torchrun across emulated nodes: use --transport torch")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, a path under a file, no permission
        raise TetherError(f"--out {out_dir}: cannot make the directory ({exc.strerror})") from None
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
    return Path("runs") / f"bench-comm-{run_stamp()}"
