"""The options of ``tether calibrate | predict | simulate`` checked as the user typed them, before
any work: a calibration measures for minutes and a prediction builds and times a model, and a
mistake found only at the end (an output path that cannot be written, a setting no run takes)
would lose that work. Each refusal is one line naming the option (:class:`TetherError`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tether.config import TrainConfig
from tether.errors import TetherError
from tether.spelling import Spell, as_dashed

if TYPE_CHECKING:  # the perf model is imported where it is used
    from tether.perf.profile import HardwareProfile


def check_out_file(out: Path, spell: Spell = as_dashed) -> None:
    """``--out`` names a file this command writes at its end: not a directory, and in a
    directory that exists or can be made, and is writable. Nothing is left behind here, so
    that a refusal or a failed measurement leaves no empty directories. ``spell``: how the
    messages name the setting (``--out``, or ``out`` for ``tether.calibrate``)."""
    if out.is_dir():
        raise TetherError(
            f"{spell('out', out)} is a directory: name the file to write (e.g. "
            f"{spell('out', out / 'profile.json')})"
        )
    _check_writable_below(out.parent, spell("out", out))


def check_out_dir(out: Path) -> None:
    """``--out`` names a directory this command writes its files into: not a file, and one
    that exists or can be made, and is writable."""
    if out.exists() and not out.is_dir():
        raise TetherError(f"--out {out} is a file, not a directory: choose another --out")
    _check_writable_below(out, as_dashed("out", out))


def _check_writable_below(directory: Path, named: str) -> None:
    existing = directory
    while not existing.exists():  # "." and "/" exist: the walk ends
        existing = existing.parent
    if not existing.is_dir():
        raise TetherError(f"{named} cannot be made: {existing} is a file, not a directory")
    try:  # what the write at the end will do (os.access says yes to root, even in /proc)
        with tempfile.TemporaryDirectory(dir=existing):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TetherError(
            f"{named} cannot be written: nothing can be made in {existing} ({reason})"
        ) from None


def calibration_workers(config: TrainConfig, workers: int) -> int:
    """At most how many workers the calibration's busy-node runs may start on the configured
    data set: as many global batches as it holds (``tether.calibrate`` counts the same). Refused
    when the runs could take no step of it: those on ``workers`` ranks take a global batch of
    ``workers`` x ``--batch-size``, which ``tether train`` would refuse only in the first timed
    run, after the layers were timed."""
    from collections.abc import Sized

    from tether.bench.calibrate import ONE_NODE
    from tether.catalog import check_global_batch, load_data

    train = load_data(config)[0]
    if not isinstance(train, Sized):
        return ONE_NODE
    samples = len(train)
    if samples == 0:
        raise TetherError("train_data is empty: there is no batch to time")
    check_global_batch(dataclasses.replace(config, workers=workers), samples)
    return max(1, min(ONE_NODE, samples // config.batch_size))


def predicted_methods(text: str) -> list[str]:
    """``--method a,b``: every name one the model predicts, and at least one."""
    from tether.perf.run_setup import PREDICTED_METHODS

    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods:
        raise TetherError(
            f"--method names no method: give one or more of {', '.join(PREDICTED_METHODS)}"
        )
    for method in methods:
        if method not in PREDICTED_METHODS:
            raise TetherError(
                f"no prediction for method '{method}': one of {', '.join(PREDICTED_METHODS)}"
            )
    return methods


def check_predict_settings(args: argparse.Namespace, methods: list[str]) -> None:
    """``tether predict``'s communication settings, as each method and worker count would take
    them, before a model is built or timed; the errors name the options (``--bucket-mb``)."""
    from tether.api.perf import method_tau, warn_tau_unused
    from tether.perf.run_setup import Setup

    if args.scaling and args.max_workers < 1:
        raise TetherError(f"--max-workers must be >= 1, got {args.max_workers}")
    for method in methods:
        for workers in args.workers:
            Setup(
                method,
                workers,
                # a --tau given is checked even where it changes nothing (it is said below)
                tau=args.tau if args.tau is not None else method_tau(method),
                bucket_mb=args.bucket_mb,
                overlap=not args.no_overlap,
                allreduce=args.allreduce,
                ranks_per_node=args.ranks_per_node,
                threads_per_worker=args.threads_per_worker,
            ).check(spell=as_dashed)
    warn_tau_unused(args.tau, methods, spell=as_dashed)  # after the checks: a refused --tau
    # is only refused


def check_one_node(
    methods: list[str], workers: list[int], profile: HardwareProfile, ranks_per_node: int | None
) -> None:
    """A method held to one node (hogwild-sgd) at more workers than a node has: refused before
    anything is timed or printed, as the prediction would refuse it."""
    from tether.perf.run_setup import Setup

    for method in methods:
        setup = Setup(method, max(workers), ranks_per_node=ranks_per_node or 0)
        setup.check_one_node(profile.name, profile.ranks_per_node, spell=as_dashed)


# tether simulate's options: (option, least, whether the least itself is refused); the
# simulator checks the same ranges, in its own names and units
_SIMULATE_RANGES = (
    ("--workers", 1, False),
    ("--rounds", 1, False),
    ("--tau", 1, False),
    ("--step-ms", 0, True),
    ("--message-ms", 0, False),
    ("--service-ms", 0, False),
    ("--heterogeneity", 0, False),
    ("--jitter", 0, False),
    ("--straggler-slowdown", 1, False),
)


def check_simulate_options(args: argparse.Namespace) -> None:
    """``tether simulate``'s numbers as typed (milliseconds as milliseconds), before the
    simulator would refuse them in its own names and units (``message_s = -0.001``)."""
    for option, least, above in _SIMULATE_RANGES:
        value = getattr(args, option[2:].replace("-", "_"))
        if value is None:  # --tau: the method's own
            continue
        ok = math.isfinite(value) and (value > least if above else value >= least)
        if not ok:
            unit = " (milliseconds)" if option.endswith("-ms") else ""
            bound = f"> {least}" if above else f">= {least}"
            raise TetherError(f"{option} must be a finite number {bound}{unit}, got {value}")
    p = args.straggler_probability
    if not 0 <= p <= 1:
        raise TetherError(f"--straggler-probability must be a probability in [0, 1], got {p}")


def slow_workers(text: str) -> tuple[int, float]:
    """``N:F`` of ``--slow-workers``: a count >= 1 and a factor > 0."""
    count, _, factor = text.partition(":")
    try:
        n, f = int(count), float(factor)
    except ValueError:
        n, f = 0, 0.0
    if n < 1 or not (math.isfinite(f) and f > 0):
        raise argparse.ArgumentTypeError(f"expected N:F like 1:4 (N >= 1, F > 0), got {text!r}")
    return n, f


def worker_factors(slow: tuple[int, float] | None, workers: int) -> list[float] | None:
    """Each simulated worker's step-time factor: the first N at F, the others at 1."""
    if slow is None:
        return None
    n, factor = slow
    if n > workers:
        raise TetherError(f"--slow-workers {n}:{factor:g} names more than the {workers} workers")
    return [factor] * n + [1.0] * (workers - n)
