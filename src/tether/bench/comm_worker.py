"""One rank of ``tether bench comm``: ``python -m tether.bench.comm_worker [options] --out FILE``.

The same program runs under every launcher, so that a single-machine run and a cluster run
measure the same thing:

* ``tether bench comm`` starts it on local ranks through torch's elastic launcher;
* across nodes, start it with torchrun on every node, e.g.
  ``torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500
  -m tether.bench.comm_worker --op allreduce --out comm.json --png comm.png --table``;
* ``--transport mpi`` runs it under ``mpiexec`` on the MPI transport (mpi4py).

Rank 0 writes the report (JSON) to ``--out``, and with ``--png``/``--table`` the plot and the
table. Every rank arms a deadline of ``--timeout`` seconds: past it, Python's faulthandler (a C
thread, which fires even while the rank is blocked inside a collective) writes the rank's stacks
next to ``--out`` (``hang-rankR.txt``) and ends the process, so a hung rank never hangs the run.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from tether.bench.comm import CommBenchArgs, add_bench_options, args_from_namespace
from tether.bench.comm_launch import hang_file
from tether.bench.comm_measure import measure
from tether.bench.comm_report import finish_report, format_table, plot_report
from tether.bench.comm_spec import BACKSTOP_S
from tether.comm.calibration.cache import load_or_calibrate
from tether.comm.calibration.model import Calibration
from tether.comm.collectives.auto import Auto
from tether.comm.collectives.base import Collective
from tether.comm.collectives.hierarchical import Hierarchical, launch_node_size
from tether.errors import TetherError
from tether.launch.affinity import pin_main_thread, pinned_core
from tether.launch.env import cache_dir, launcher_local_world_size
from tether.launch.error_file import record_errors

Predict = Callable[[str, str, float], float | None]


def build_parser() -> argparse.ArgumentParser:
    from tether.cli import OneLineParser

    parser = OneLineParser(
        prog="python -m tether.bench.comm_worker",
        description="One rank of `tether bench comm`; start it with a launcher (torchrun, "
        "mpiexec). Rank 0 writes the report.",
    )
    add_bench_options(parser)
    parser.add_argument("--out", type=Path, required=True, metavar="FILE", help="report (JSON)")
    parser.add_argument("--png", type=Path, metavar="FILE", help="also plot the report here")
    parser.add_argument("--table", action="store_true", help="rank 0 prints the table on stdout")
    # Test hook: this rank sleeps instead of measuring (the deadline must end the run).
    parser.add_argument("--debug-hang-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


class Deadline:
    """faulthandler's watchdog: at ``seconds``, dump every thread's stack to a file and exit.

    Armed before the transport exists, under a name of this process; :meth:`name_rank` renames
    the file once the rank is known (an MPI rank learns its rank only from MPI)."""

    def __init__(self, out: Path, seconds: float) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        self.path = out.parent / f"hang-pid{os.getpid()}.txt"
        self.handle: IO[str] = self.path.open("w")
        faulthandler.dump_traceback_later(seconds, exit=True, file=self.handle)

    def name_rank(self, path: Path) -> None:
        self.path = self.path.rename(path)  # the open handle follows the file

    def cancel(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        self.handle.close()
        if not self.path.stat().st_size:
            self.path.unlink()


class Placement:
    """The initialised transport of this rank and what the measurement needs around it."""

    def __init__(self, args: CommBenchArgs) -> None:
        self.device = torch.device("cpu")
        self.backend = "mpi" if args.transport == "mpi" else "gloo"
        self.sync: Callable[[], None] = lambda: None
        self.transport: Any
        self.local_rank = 0  # this rank's index among the ranks of its node
        if args.transport == "mpi":
            self._init_mpi()
        else:
            self._init_torch(args)
        # The node layout the launcher reports, for hierarchical and the calibration (the
        # collectives read no environment): the whole group where it does not say.
        world = self.transport.world_size
        self.ranks_per_node = launch_node_size(world, launcher_local_world_size())

    def _init_torch(self, args: CommBenchArgs) -> None:
        from tether.comm.transport import TorchTransport
        from tether.launch.env import DistEnv
        from tether.launch.worker import init_process_group, place

        env = DistEnv.read()
        if not env.launched:
            raise TetherError(
                "the comm worker runs under a launcher: `tether bench comm`, torchrun, or "
                "mpiexec with --transport mpi"
            )
        self.backend, self.device = place(args.backend, env)
        self.local_rank = env.local_rank
        if self.backend == "nccl":
            self.sync = torch.cuda.synchronize
        init_process_group(self.backend, env, args.timeout_s + BACKSTOP_S)
        self.transport = TorchTransport()

    def _init_mpi(self) -> None:
        try:
            from tether.comm.mpi_transport import MPITransport
        except ImportError as exc:
            raise TetherError(f"--transport mpi is not available here: {exc}") from None
        self.backend = "mpi"
        self.transport = transport = MPITransport()
        from mpi4py import MPI

        self.local_rank = transport.comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()

    def close(self) -> None:
        from tether.launch.teardown import shut_down_process_group

        self.transport = None  # the group's backend goes with the last reference to it
        shut_down_process_group()


def calibration_for(placement: Placement, args: CommBenchArgs) -> Calibration | None:
    """This group's calibration (:mod:`tether.comm.calibration`) where the run needs one: for
    the predictions, for ``auto``, or measured again for ``--recalibrate``; cached where the
    launcher keeps caches, apart for pinned ranks. Collective: every rank loads or measures
    it."""
    if not (args.predict or args.recalibrate or "auto" in args.algos):
        return None
    return load_or_calibrate(
        placement.transport,
        cache_dir(),
        placement.ranks_per_node,
        pinned=pinned_core() is not None,
        refresh=args.recalibrate,
    )


def timed_collectives(
    calibration: Calibration | None, ranks_per_node: int
) -> dict[str, Collective]:
    """The collectives timed under the names whose registered instance cannot know this run:
    ``hierarchical`` on the launcher's nodes, ``auto`` on this group's calibration."""
    timed: dict[str, Collective] = {"hierarchical": Hierarchical(ranks_per_node=ranks_per_node)}
    if calibration is not None:
        timed["auto"] = Auto(calibration)
    return timed


def predictor(
    calibration: Calibration | None, args: CommBenchArgs
) -> tuple[Predict | None, dict[str, Any]]:
    """The alpha-beta-gamma prediction of the calibration, and what the report says about where
    it came from."""
    if calibration is None or not args.predict:
        return None, {"source": None, "reason": "--no-predict"}

    def predict(algo: str, kind: str, n_bytes: float) -> float | None:
        try:
            return calibration.predict(algo, kind, n_bytes)
        except TetherError:  # e.g. an algorithm that refuses this group size
            return None

    fields = ("alpha", "beta", "gamma", "ranks_per_node", "backend", "host", "measured_at")
    info = {name: getattr(calibration, name, None) for name in fields}
    info["round_cost"] = calibration.round_cost_json()  # what priced the rounds, if fitted
    return predict, {"source": "tether.comm.calibration", **info}


@record_errors
def run(argv: list[str] | None = None) -> None:
    ns = build_parser().parse_args(argv)
    args = args_from_namespace(ns)
    deadline = Deadline(ns.out, args.timeout_s)
    try:
        torch.set_num_threads(1)  # N ranks on a few cores must not oversubscribe them
        placement = Placement(args)
        if args.pin:  # after the transport is up, so its own threads stay unpinned
            pin_main_thread(placement.local_rank)
        deadline.name_rank(hang_file(ns.out, placement.transport.rank))
        _run_rank(placement, args, ns)
    finally:
        deadline.cancel()
    # After a clean run only (why: tether.launch.worker.run_worker).
    placement.close()


def _run_rank(placement: Placement, args: CommBenchArgs, ns: argparse.Namespace) -> None:
    transport = placement.transport
    if ns.debug_hang_rank == transport.rank:
        time.sleep(args.timeout_s + 2 * BACKSTOP_S)
    calibration = calibration_for(placement, args)  # collective: before anything is timed
    predict, predictions = predictor(calibration, args)
    raw = measure(
        transport,
        args,
        placement.device,
        placement.sync,
        predict,
        progress=sys.stderr if transport.rank == 0 and not ns.quiet else None,
        collectives=timed_collectives(calibration, placement.ranks_per_node),
    )
    if transport.rank != 0:
        return
    from tether.observe.files import atomic_write_json

    meta = {
        "benchmark": "comm",
        "op": args.op,
        "workers": transport.world_size,
        "transport": args.transport,
        "pinned": args.pin,
        "backend": placement.backend,
        "device": str(placement.device),
        "host": socket.gethostname(),
        "machine": f"{platform.machine()} {platform.processor()}".strip(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "root": 0 if args.kind in ("broadcast", "reduce") else None,
        "algos": list(args.algos),
        "predictions": predictions,
    }
    report = finish_report(raw, meta)
    atomic_write_json(ns.out, report)
    if ns.png is not None:
        plot_report(report, ns.png)
    if ns.table:
        print(format_table(report), flush=True)


def main(argv: list[str] | None = None) -> int:
    from tether.launch.exits import worker_exit_status

    return worker_exit_status(lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
