"""``tether calibrate`` and ``tether predict`` (``tether simulate``: :mod:`tether.simulate_command`):
the performance model on the command line. Names and import paths become objects here (the model, the data for its input
shape, the profile); the work is :mod:`tether.perf`, :mod:`tether.bench.calibrate` and
:mod:`tether.api.perf`. docs/performance.md explains the model and its validation.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path
from typing import Any

from tether import perf_inputs, perf_workloads
from tether.config import TrainConfig
from tether.errors import SettingError
from tether.run_names import run_stamp
from tether.simulate_command import add_simulate_parser
from tether.spelling import as_dashed
from tether.words import counted

MAX_SCALING_WORKERS = 4096


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers like 1,2,4, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected counts >= 1 like 1,2,4, got {text!r}")
    return values


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        help="model name or module:factory (default lenet5; tether predict with a profile file "
        "from tether calibrate: the model that file timed)",
    )
    parser.add_argument(
        "--dataset",
        default="fashion-mnist",
        help="data set name or module:loader (gives the input shape and one batch)",
    )
    parser.add_argument("--data-dir", help="directory holding the data set's files")
    parser.add_argument(
        "--loss", default=TrainConfig.loss, help="cross-entropy | mse | l1 | module:function"
    )
    parser.add_argument("--batch-size", type=int, help="per-worker batch (default 64)")
    parser.add_argument("--threads-per-worker", type=int, default=1, help="threads (default 1)")


def _config(args: argparse.Namespace) -> TrainConfig:
    from tether.catalog import check_names

    config = dataclasses.replace(
        TrainConfig(),
        model=args.model or "lenet5",
        dataset=args.dataset,
        data_dir=args.data_dir,
        loss=args.loss,
        batch_size=args.batch_size if args.batch_size is not None else TrainConfig.batch_size,
        threads_per_worker=args.threads_per_worker,
    )
    try:  # a batch size or thread count no run could use: one line, naming the option
        config.validate()
    except SettingError as refused:
        raise refused.respelled({refused.key: as_dashed(refused.key)}) from None
    check_names(config)
    return config


def cmd_calibrate(args: argparse.Namespace) -> int:
    import socket

    from tether.bench.calibrate import CalibrationOptions, calibrate_machine, write_calibration
    from tether.bench.compute_samples import TrainerLoops

    config = _config(args)
    threads = config.threads_per_worker
    options = CalibrationOptions(args.workers, threads, args.loop_runs, args.timeout)
    options.check(args.loop_steps, args.repeats)  # before minutes of timing
    name = args.name or f"{socket.gethostname()}-calibrated"
    out = Path(args.out) if args.out else Path("runs") / f"calibrate-{run_stamp()}" / "profile.json"
    perf_inputs.check_out_file(out)
    most = perf_inputs.calibration_workers(config, args.workers)  # before any timing
    options = dataclasses.replace(options, most_workers=most)
    train_argv = ["--model", config.model, "--dataset", config.dataset, "--loss", config.loss]
    train_argv += ["--batch-size", str(config.batch_size)]
    # the thread count the layers were timed with (alone on the node, a worker would get all)
    train_argv += ["--threads-per-worker", str(threads)]
    train_argv += ["--data-dir", config.data_dir] if config.data_dir else []
    calibration = calibrate_machine(
        name,
        f"{config.model} at batch {config.batch_size}",
        lambda: perf_workloads.timed_workload(config, name, args.repeats),
        TrainerLoops(train_argv, 10, 10 + args.loop_steps),
        options,
        lambda line: print(f"tether: {line}", file=sys.stderr),
    )
    profile, workload = calibration.profile, calibration.workload
    links, wire = calibration.links, calibration.wire
    samples, busy, step_s = calibration.samples, profile.busy_node_slowdown, calibration.step_s
    write_calibration(out, profile, workload, calibration.extra())
    print(
        f"alpha {links.alpha * 1e6:.1f} us, beta {links.beta * 1e9:.3f} ns/B "
        f"({1 / links.beta / 1e9 if links.beta else float('inf'):.2f} GB/s), gamma "
        f"{links.gamma * 1e12:.1f} ps/B; {config.model} step {step_s * 1e3:.2f} ms at batch "
        f"{config.batch_size} (+{workload.data_s * 1e3:.2f} ms of data and loop; the loop "
        f"{_spread_ms(samples.loop_steps_s())} ms/step over "
        f"{counted(len(samples.single), 'run')}), "
        f"{profile.flops.value / 1e9:.2f} GFLOP/s achieved; server wire alpha "
        f"{wire.alpha * 1e6:.1f} us, beta {wire.beta * 1e9:.3f} ns/B"
        + (
            f"; a busy node slows a worker {busy.value:.2f}x ({samples.node_workers} workers)"
            if busy is not None
            else ""
        )
        + (
            f"; an exchange in training costs {load.alpha.value * 1e6:.1f} us more per message "
            f"and waits {load.skew.value * 1e3:.2f} ms for the later of 2 ranks; a parameter "
            f"server spends {load.server.value * 1e3:.2f} ms more per exchange"
            if (load := profile.exchange_load) is not None
            else ""
        )
    )
    print(f"tether: wrote {out} (tether predict --profile {out})", file=sys.stderr)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from tether.api.perf import method_tau
    from tether.batch_notes import held_batches_note
    from tether.observe.perf_plots import plot_breakdown, plot_scaling
    from tether.perf.profile import load_profile
    from tether.perf.scaling import ScalingCutWarning

    methods = perf_inputs.predicted_methods(args.method)  # before anything is loaded or timed
    perf_inputs.check_predict_settings(args, methods)
    out = Path(args.out) if args.out else Path("runs") / f"predict-{run_stamp()}"
    perf_inputs.check_out_dir(out)
    profile = load_profile(args.profile)
    perf_inputs.check_one_node(methods, args.workers, profile, args.ranks_per_node)
    if args.model is None:  # the model the profile file timed, else lenet5
        args.model = perf_workloads.stored_model(args.profile)
    config = _config(args)
    used = perf_workloads.workload_for(config, args.profile, profile.name)
    workload = used.workload
    settings: dict[str, Any] = {
        "bucket_mb": args.bucket_mb,
        "overlap": not args.no_overlap,
        "allreduce": args.allreduce,
        "ranks_per_node": args.ranks_per_node,
        "threads_per_worker": config.threads_per_worker,
    }
    print(
        f"{config.model}, batch {workload.batch_size} per worker, "
        f"{size_text(workload.parameters_bytes)} of parameters, on profile {profile.name} "
        f"({used.source})"
    )
    threads = workload.timed_threads_note(
        profile, config.threads_per_worker, "--threads-per-worker"
    )
    for line in (*used.notes, threads):
        if line is not None:
            print(line)
    curve_counts = [
        1 << k for k in range(args.max_workers.bit_length()) if 1 << k <= args.max_workers
    ]
    # a weak-scaling curve keeps the per-worker batch: its counts are runs at that batch too
    weak_counts = curve_counts if args.scaling == "weak" else []
    note = (  # a data set smaller than the batch has its own note above: train would refuse it
        None
        if args.batch_size is not None or workload.batch_size != config.batch_size
        else held_batches_note(methods, [*args.workers, *weak_counts], workload.batch_size)
    )
    if note is not None:
        print(note)
    print(
        f"{'method':<16}{'workers':>8}{'iter ms':>10}{'compute':>10}{'update':>9}"
        f"{'exposed comm':>14}{'comm share':>12}{'samples/s':>14}"
    )
    rows, report = [], []
    for method in methods:
        tau = method_tau(method, args.tau)
        for p in args.workers:
            pred = perf_workloads.predict(workload, method, p, profile, tau=tau, **settings)
            d = pred.to_dict()
            report.append({**d, "tau": tau})
            rows.append({**d, "label": f"{method} x{p}"})
            print(
                f"{method:<16}{p:>8}{pred.iteration_s * 1e3:>10.3f}"
                f"{(pred.compute_s - pred.update_s) * 1e3:>10.3f}{pred.update_s * 1e3:>9.3f}"
                f"{pred.exposed_comm_s * 1e3:>14.3f}{pred.comm_share:>12.1%}"
                f" {pred.samples_per_s:>13.1f}"
            )
            if method == "sync-sgd":
                print(f"{'':<16}{perf_workloads.sync_sgd_line(pred.details)}")
    result: dict[str, Any] = {
        "profile": profile.to_dict(),
        "workload": workload.to_dict(),
        "predictions": report,
    }
    out.mkdir(parents=True, exist_ok=True)
    plot_breakdown(rows, out / "breakdown.png", title=f"{config.model} on {profile.name}")
    # an earlier prediction's curves beside this one's numbers would be read as this one's
    (out / "scaling.png").unlink(missing_ok=True)
    if args.scaling:
        curves = {}
        ends = []
        for method in methods:
            with warnings.catch_warnings(record=True) as heard:
                warnings.simplefilter("always", ScalingCutWarning)
                curves[method] = perf_workloads.predict_scaling(
                    workload,
                    method,
                    profile,
                    curve_counts,
                    strong=args.scaling == "strong",
                    tau=method_tau(method, args.tau),
                    **settings,
                )
            for warning in heard:  # a curve's end is printed below; anything else goes on
                if issubclass(warning.category, ScalingCutWarning):
                    ends.append(str(warning.message))
                else:
                    warnings.warn(warning.message, warning.category, stacklevel=1)
        result["scaling"] = {"kind": args.scaling, "curves": curves}
        plot_scaling(
            curves,
            out / "scaling.png",
            title=f"{args.scaling} scaling of {config.model} on {profile.name}",
        )
        for method, curve in curves.items():
            last = curve[-1]
            print(
                f"{args.scaling} scaling, {method}: {last['workers']} workers at "
                f"{last['efficiency']:.1%} efficiency ({last['samples_per_s']:.0f} samples/s)"
            )
        for end in dict.fromkeys(ends):  # once each (the batch's end is every method's)
            hint = " (--batch-size for a larger one)" if end.startswith("strong") else ""
            print(end + hint)
    from tether.observe.files import atomic_write_json

    atomic_write_json(out / "predict.json", result)
    print(f"tether: wrote {out}/predict.json and the figures beside it", file=sys.stderr)
    return 0


def size_text(n_bytes: float) -> str:
    """``18.16 MiB``, or ``3.5 KiB`` for what would print as 0.00 MiB."""
    if n_bytes >= 2**20 / 10:
        return f"{n_bytes / 2**20:.2f} MiB"
    return f"{n_bytes / 2**10:.1f} KiB"


def _spread_ms(seconds: list[float]) -> str:
    """``0.41-0.52`` (ms) over several samples; one value where they agree (one run)."""
    low, high = f"{min(seconds) * 1e3:.2f}", f"{max(seconds) * 1e3:.2f}"
    return low if low == high else f"{low}-{high}"


def add_perf_parsers(sub: Any) -> None:
    """The three subcommands on the ``tether`` parser."""
    calibrate = sub.add_parser(
        "calibrate",
        help="measure this machine and a model into a profile for `tether predict`",
        description="Time the model's training step layer by layer (forward, backward, update) "
        "and the backend's all-reduce on local ranks; write a hardware profile with the timed "
        "workload (JSON).",
    )
    _add_model_options(calibrate)
    calibrate.add_argument("--workers", type=int, default=2, help="ranks for the links (2)")
    calibrate.add_argument("--name", help="profile name (default: HOST-calibrated)")
    calibrate.add_argument("--repeats", type=int, default=20, help="timed steps (default 20)")
    calibrate.add_argument(
        "--loop-steps", type=int, default=60, help="training-loop steps timed (default 60)"
    )
    calibrate.add_argument(
        "--loop-runs",
        type=int,
        default=3,
        help="samples of the model's step, the training loop, the links and the exchange in "
        "training, spread over the calibration; the medians count (default 3)",
    )
    calibrate.add_argument("--timeout", type=float, default=120.0, help="seconds (default 120)")
    calibrate.add_argument("--out", metavar="FILE", help="default runs/calibrate-TIME/profile.json")
    calibrate.set_defaults(func=cmd_calibrate)

    predict = sub.add_parser(
        "predict",
        help="predict iteration time and scaling of a method on a hardware profile",
        description="The DAG model of one iteration (wait-free backprop, fusion buckets, "
        "MG-WFBP) and each method's communication, on a built-in profile or one written by "
        "`tether calibrate`. Writes OUT/predict.json, breakdown.png and (--scaling) "
        "scaling.png.",
    )
    _add_model_options(predict)
    predict.add_argument("--method", default="sync-sgd", help="method(s), comma-separated")
    predict.add_argument(
        "--workers", type=_int_list, default=[1, 2, 4], help="worker counts (default 1,2,4)"
    )
    predict.add_argument("--profile", default="vm-2cores", help="built-in name or JSON file")
    predict.add_argument("--tau", type=int, help="steps per round (default: the method's)")
    predict.add_argument("--bucket-mb", type=float, default=1.0, help="fusion bucket (MiB)")
    predict.add_argument("--allreduce", default="native", help="all-reduce algorithm")
    predict.add_argument("--no-overlap", action="store_true", help="communication not overlapped")
    predict.add_argument("--ranks-per-node", type=int, default=0, help="default: the profile's")
    predict.add_argument("--scaling", choices=("weak", "strong"), help="also the scaling curve")
    predict.add_argument(
        "--max-workers", type=int, default=MAX_SCALING_WORKERS, help="scaling curve's end (4096)"
    )
    predict.add_argument("--out", metavar="DIR", help="default runs/predict-TIME")
    predict.set_defaults(func=cmd_predict)
    add_simulate_parser(sub)
