"""The ``tether`` command line: ``tether train``, ``tether launch``, ``tether compare``,
``tether bench``, ``tether calibrate | predict | simulate`` (:mod:`tether.perf_commands`,
:mod:`tether.simulate_command`) and ``tether list``.

User mistakes print one line (``tether: error: ...``) and exit with code 2, without a traceback;
a failed worker prints which rank failed and why and exits with code 1.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
from pathlib import Path
from typing import Any, NoReturn

from tether.batch_notes import batch_text
from tether.config import TrainConfig
from tether.errors import SettingError, TetherError, WorkerFailure, warnings_in_one_line
from tether.perf_commands import add_perf_parsers
from tether.run_names import run_stamp
from tether.train_options import (
    add_train_options,
    as_flag,
    config_from_args,
    given_values,
    said_as_typed,
)
from tether.words import counted


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes print one line and exit 2, like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tether: error: {message} (see `{self.prog} --help`)\n")


def cmd_train(args: argparse.Namespace) -> int:
    from tether.catalog import (
        check_data,
        check_launch,
        check_stop_at_target,
        task_from_config,
        uses_import_paths,
    )
    from tether.ignored_settings import warn_ignored, warn_long_warmup
    from tether.methods import METHODS
    from tether.observe.summary import run_summary_text
    from tether.runner import launch_training
    from tether.training.model_parallel import check_plan_on_model
    from tether.training.probe import probe_task, unseeded_model
    from tether.training.run_dir import check_run_dir

    stamp = run_stamp()
    given = given_values(args)
    config = config_from_args(args, lambda c: f"runs/{c.method}-{stamp}", given)
    warn_ignored(config, set(given), spell=as_flag)
    # Fail on missing or corrupt data here, in one line, before any worker starts; the user's
    # own components also get a dry run on two samples (a loss that returns a vector, a model
    # that does not fit the data).
    samples = check_data(config)
    check_launch(config, spell=as_flag)
    check_stop_at_target(config)
    model, task = None, None
    if uses_import_paths(config) or config.model_parallel > 1 or config.resume:
        task = task_from_config(config)
        model = unseeded_model(task)  # built once, for every check below
        METHODS.get(config.method).check_model(model)  # e.g. one dtype
        # every layer the plan splits, before launch, and before the probe's forward (which
        # turns a LazyLinear the plan cannot split into a Linear it can)
        check_plan_on_model(config, model)
        probe_task(task, model=model, target=config.target_spec, config=config)
        samples = len(task.train_data)  # type: ignore[arg-type]  # probe_task: map-style
    if samples is not None:
        warn_long_warmup(config, samples, spell=as_flag)
    # before anything is printed or launched; a resumed checkpoint against the model's shapes
    check_run_dir(config, args.overwrite, model if config.resume else None, task)
    processes = config.workers + METHODS.get(config.method).server_processes
    groups = f" in model groups of {config.model_parallel}" if config.model_parallel > 1 else ""
    print(
        f"tether: {config.method} on {counted(config.workers, 'worker')}{groups} "
        f"({counted(processes, 'process', 'processes')}), "
        f"{batch_text(config, set(given))}"
        f"{communication_text(config, METHODS.get(config.method).settings)}, "
        f"{config.model} / {config.dataset}, run directory {config.out}",
        file=sys.stderr,
    )
    assert config.out is not None  # config_from_args names a run directory when none is given
    out = Path(config.out)
    try:
        launch_training(config, overwrite=args.overwrite)
    except KeyboardInterrupt:
        print(f"tether: interrupted{_resume_hint(out)}", file=sys.stderr)
        return 130
    except WorkerFailure as failure:
        raise WorkerFailure(f"{failure}{_resume_hint(out)}", failure.ranks) from None
    print(run_summary_text(out))
    return 0


def _resume_hint(out: Path) -> str:
    """How to go on with a run that ended early, where it left a checkpoint to go on from."""
    from tether.training.checkpoint import CHECKPOINT_NAME  # torch: loaded by the run anyway

    if not (out / CHECKPOINT_NAME).exists():
        return ""
    return f"; it can go on from its last checkpoint: tether train --resume {out}"


def cmd_compare(args: argparse.Namespace) -> int:
    from tether.compare import parse_methods, run_comparison

    if hasattr(args, "method"):
        raise TetherError("tether compare takes --methods a,b,... (not --method)")
    methods = parse_methods(args.methods)  # every name checked before anything runs
    stamp = run_stamp()
    config = config_from_args(args, lambda c: f"runs/compare-{stamp}")

    def config_for(method: str) -> TrainConfig:
        # The user's options over each method's own defaults (e.g. its tuned learning rate).
        per_method = argparse.Namespace(**{**vars(args), "method": method})
        return config_from_args(per_method, lambda c: str(config.out))

    return run_comparison(config, methods, config_for, overwrite=args.overwrite)


def cmd_launch(args: argparse.Namespace) -> int:
    from tether.launch.local import launch_script
    from tether.methods import METHODS

    if args.workers < 1:
        raise TetherError(f"--workers must be >= 1, got {args.workers}")
    script = Path(args.script)
    if not script.is_file():
        raise TetherError(f"no script {script}: tether launch runs a Python file")
    servers, tolerant = 0, False
    if args.method is not None:
        method = METHODS.get(args.method)
        servers = method.server_processes
        tolerant = bool(getattr(method, "tolerates_worker_loss", False))
    processes = args.workers + servers
    print(
        f"tether: {counted(processes, 'process', 'processes')} "
        f"({counted(args.workers, 'worker')}"
        f"{' + 1 server' if servers else ''}) running {script}",
        file=sys.stderr,
    )
    launch_script([str(script), *args.args], processes, tolerant, args.method, servers)
    return 0


def cmd_bench_comm(args: argparse.Namespace) -> int:
    from tether.bench.comm import args_from_namespace, default_out_dir, run_comm_bench
    from tether.bench.comm_report import wrong_results

    bench = args_from_namespace(args)  # every option checked before anything starts
    out = args.out if args.out is not None else default_out_dir()
    report = run_comm_bench(
        bench,
        args.workers,
        out,
        " ".join(args.command_line),
        nodes=args.nodes,
        link_mbit=args.link_mbit,
    )
    print(f"tether: wrote {out / 'comm.json'} and {out / 'comm.png'}", file=sys.stderr)
    wrong = wrong_results(report)
    if wrong:
        print(f"tether: error: wrong results from {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    del args
    from tether.catalog import method_defaults
    from tether.comm.collectives import COLLECTIVES
    from tether.data import DATASETS
    from tether.methods import METHODS
    from tether.methods.default_rates import describe_rate
    from tether.metrics import METRICS
    from tether.models import MODELS
    from tether.optim import OPTIMIZERS, SCHEDULES
    from tether.training.objective import LOSSES

    registries = (
        ("methods", METHODS),
        ("models (or --model module:factory)", MODELS),
        ("datasets (or --dataset module:loader returning (train, eval))", DATASETS),
        ("losses (or --loss module:function)", LOSSES),
        ("optimizers (--optimizer; auto = the method's own local step)", OPTIMIZERS),
        ("learning-rate schedules (--lr-schedule, with --warmup-steps)", SCHEDULES),
        ("metrics (--metric)", METRICS),
        ("collectives (--allreduce, tether bench comm --algo)", COLLECTIVES),
    )
    for title, registry in registries:
        print(f"{title}:")
        for name in registry.names():
            print(f"  {name:<18} {registry.describe(name)}")
    print("method defaults (a rate given with --lr is taken as it is; see README, Methods):")
    for name in METHODS.names():
        print(f"  {name:<18} {describe_rate(method_defaults(name))}")
    return 0


def add_bench_parser(sub: Any) -> None:
    from tether.bench.comm import add_bench_options

    bench = sub.add_parser("bench", help="benchmarks (collective algorithms: `tether bench comm`)")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    comm = kinds.add_parser(
        "comm",
        help="time our collective algorithms against the backend's own",
        description="OSU/nccl-tests style sweep: for each size and algorithm, the median over "
        "repeats of the slowest rank's time per call, algbw = bytes/time and busbw = algbw * "
        "2(P-1)/P (allreduce), (P-1)/P (allgather), 1 (broadcast, reduce), the alpha-beta "
        "prediction and the ratio to native; every result is checked exactly. Writes "
        "OUT/comm.json and OUT/comm.png (OUT defaults to runs/bench-comm-TIMESTAMP).",
    )
    add_bench_options(comm)
    comm.add_argument("--workers", type=int, default=2, help="local ranks (default 2)")
    comm.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="emulate this many nodes (network namespaces, needs root), --workers split evenly",
    )
    comm.add_argument(
        "--link-mbit",
        type=float,
        default=None,
        help="cap each emulated node's link at this many Mbit/s (tc tbf; default: unshaped)",
    )
    comm.add_argument("--out", type=Path, metavar="DIR", help="output directory")
    comm.set_defaults(func=cmd_bench_comm)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tether", description="Communication-efficient distributed training for PyTorch."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a model on local worker processes")
    add_train_options(train)
    train.set_defaults(func=cmd_train)
    compare = sub.add_parser(
        "compare",
        help="run several methods on the same job and compare them",
        description="Run each method as a normal training run in OUT/METHOD/ (same model, data, "
        "workers, length and seed, and the same batch unless a method's defaults hold its "
        "global batch: each row shows the batch it ran with), then write OUT/compare.json, "
        "compare.md and compare.png. --out OUT defaults to runs/compare-TIMESTAMP; time to "
        "target uses --target-accuracy, or 0.85 when not given.",
    )
    compare.add_argument(
        "--methods",
        metavar="A,B,...",
        help="comma-separated methods to compare (default: every method in `tether list`)",
    )
    add_train_options(
        compare,
        out_default="runs/compare-TIMESTAMP",
        resumable=False,
        target_help="not taken: tether compare times every method to a test accuracy "
        "(--target-accuracy)",
        unlisted=("method",),
    )
    compare.set_defaults(func=cmd_compare)
    launch = sub.add_parser(
        "launch",
        help="run your own training script on local worker processes (tether.init inside)",
        description="Start SCRIPT in --workers local processes under torch's elastic agent, as "
        "torchrun would, with the environment tether.init() reads. With --method, a method "
        "with a parameter server gets one more process (rank 0), tether.init() uses that "
        "method when the script names none, and asynchronous methods survive a lost worker.",
    )
    launch.add_argument("--workers", type=int, default=2, help="computing workers (default 2)")
    launch.add_argument("--method", help="the training method the script runs (tether list)")
    launch.add_argument("script", help="the Python script to run")
    launch.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    launch.set_defaults(func=cmd_launch)
    add_bench_parser(sub)
    add_perf_parsers(sub)
    listing = sub.add_parser("list", help="list methods, models and data sets")
    listing.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    warnings_in_one_line()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = ["tether", *(sys.argv[1:] if argv is None else argv)]
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # here, not at exit, where a reader gone away is an unhandled error
        return status
    except TetherError as exc:
        said = said_as_typed(exc, args) if isinstance(exc, SettingError) else exc
        print(f"tether: error: {said}", file=sys.stderr)
        return 2
    except WorkerFailure as exc:
        print(f"tether: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tether: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_gone():
            raise  # another pipe than the reader of our output: its traceback says which
        # the reader went away (`tether list | head`): no traceback, and none again when
        # Python flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def communication_text(config: TrainConfig, used: frozenset[str]) -> str:
    """The communication settings the run changed from the defaults and its method ``used``,
    for its first line (they were in config.toml alone): ``, all-reduce ring, fp16 on the
    wire``."""
    parts = []
    if "allreduce" in used and config.allreduce != TrainConfig.allreduce:
        parts.append(f"all-reduce {config.allreduce}")
    if "compress" in used and config.compress != TrainConfig.compress:
        parts.append(f"{config.compress} on the wire")
    if "bucket_mb" in used and config.bucket_mb != TrainConfig.bucket_mb:
        size = f"buckets of {config.bucket_mb:g} MiB"
        parts.append(size if config.bucket_mb else "one message per parameter")
    return "".join(f", {part}" for part in parts)


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (POLLERR on the writing end)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


if __name__ == "__main__":
    sys.exit(main())
