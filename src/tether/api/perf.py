"""The performance model from Python: time the user's own model, predict a method's iteration
time and scaling on any hardware profile, simulate the asynchronous methods.

    workload = tether.time_model(net, inputs, targets, loss=F.cross_entropy)
    p = tether.predict(workload, method="sync-sgd", workers=8, profile="p40-cluster")
    p.iteration_s, p.comm_share, p.details["recommended_bucket_mb"]
    rows = tether.predict_scaling(workload, method="sync-easgd", profile="k80-8gpu-pcie",
                                  workers=[1, 2, 4, 8], strong=False)
    r = tether.simulate("async-easgd", workers=4096, rounds=1000, step_s=0.01, tau=4)

The pieces are :mod:`tether.perf` (pure: profiles, formulas, the DAG model, the simulator) and
:mod:`tether.bench.workload` (the timing); the command line (``tether calibrate | predict |
simulate``) is a thin layer over the same functions.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from tether.catalog import loss_named, method_defaults
from tether.errors import TetherError
from tether.perf.checks import is_whole
from tether.perf.predict import Prediction, Setup
from tether.perf.predict import predict as _predict
from tether.perf.profile import HardwareProfile, load_profile
from tether.perf.run_setup import (
    EVERY_STEP_METHODS,
    SIMULATED_MESSAGE_S,
    SIMULATED_ROUNDS,
    SIMULATED_SERVICE_S,
    SIMULATED_STEP_S,
)
from tether.perf.scaling import ScalingCutWarning, curve_end, scaling
from tether.perf.simulator import SimulationConfig, SimulationResult, WorkerSpeeds
from tether.perf.simulator import simulate as _simulate
from tether.perf.workload import TimedThreadsWarning, Workload
from tether.spelling import Spell, as_keyword

HERE = "this machine (timed)"


def time_model(
    model: nn.Module,
    inputs: Any,
    targets: Any,
    loss: Callable[..., torch.Tensor] | str,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    name: str | None = None,
    threads: int = 1,
    repeats: int = 20,
    profile_name: str = HERE,
    data_s: float = 0.0,
) -> Workload:
    """Time ``model``'s training step on one batch, layer by layer, on this machine.

    ``optimizer`` defaults to momentum SGD over the model's parameters. The result predicts
    with measured times on the profile named ``profile_name`` (a profile written by ``tether
    calibrate`` for this machine), and with its counted FLOPs on any other. ``data_s``: what
    your training loop adds per step beyond the model's step (loading the batch, logging), if
    you know it (``tether calibrate`` measures it by running the trainer)."""
    from tether.bench.calibrate import time_model as timed
    from tether.bench.workload import batch_size_of

    if not isinstance(model, nn.Module):
        raise TetherError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise TetherError(
            f"model ({type(model).__name__}) has no trainable parameters: a training step of "
            "it updates nothing and sends nothing"
        )
    if batch_size_of(inputs) < 1:  # a workload of batch 0 would predict 0 samples/s
        raise TetherError("inputs hold no sample: time a batch of at least one")
    threads = _count("threads", threads, 1)
    repeats = _count("repeats", repeats, 1)  # the median of no timed step is no time
    opt = optimizer or torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    workload, _ = timed(
        model,
        inputs,
        targets,
        loss_named(loss),  # "mse", as tether.fit takes it
        opt,
        name or type(model).__name__,
        profile_name,
        threads,
        repeats,
    )
    return dataclasses.replace(workload, data_s=data_s)


def _profile(profile: str | os.PathLike[str] | HardwareProfile) -> HardwareProfile:
    if isinstance(profile, HardwareProfile):
        return profile
    if not isinstance(profile, str | os.PathLike):
        raise TetherError(
            f"profile must be a built-in profile's name, a profile file's path or a "
            f"HardwareProfile, not {type(profile).__name__}"
        )
    return load_profile(os.fspath(profile))


def _workload(workload: Workload, batch_size: int | None = None) -> Workload:
    if not isinstance(workload, Workload):
        raise TetherError(
            f"workload must be a Workload (from tether.time_model or tether.calibrate), not "
            f"{type(workload).__name__}"
        )
    if batch_size is None:
        return workload
    return workload.at_batch(_count("batch_size", batch_size, 1))


def predict(
    workload: Workload,
    method: str,
    workers: int,
    profile: str | HardwareProfile = "vm-2cores",
    batch_size: int | None = None,
    **settings: Any,
) -> Prediction:
    """Predicted seconds per local step of ``method`` on ``workers`` workers, with the breakdown
    (``compute_s``, ``exposed_comm_s``, ``update_s``, ``comm_share``, ``details``).
    ``batch_size``: the per-worker batch to predict at (default: the workload's; the layers'
    times scale with it, as ``tether predict --batch-size``). ``settings``: ``tau`` (default:
    the method's own), ``bucket_mb``, ``overlap``, ``allreduce``, ``ranks_per_node``,
    ``threads_per_worker`` (as ``tether train`` takes them)."""
    found, hardware, setup = (
        _workload(workload, batch_size),
        _profile(profile),
        _setup(method, workers, settings),
    )
    _warn_threads(found, hardware, setup)
    return _predict(found, hardware, setup)


def predict_scaling(
    workload: Workload,
    method: str,
    profile: str | HardwareProfile = "vm-2cores",
    workers: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    strong: bool = False,
    batch_size: int | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Throughput, the ideal line and efficiency for each worker count; weak scaling keeps the
    per-worker batch (``batch_size``, default the workload's), strong scaling the global batch
    of the first count. ``settings`` as :func:`predict` takes them. A curve that stops
    before the last count (no samples left to share, or ``hogwild-sgd`` past one node) says why
    in a :class:`~tether.perf.scaling.ScalingCutWarning`."""
    if not isinstance(workers, Iterable) or isinstance(workers, str):
        raise TetherError(
            f"workers must be a list of worker counts (e.g. [1, 2, 4, 8]), got {workers!r}"
        )
    counts = list(workers)
    if not counts or not all(is_whole(p) and p >= 1 for p in counts):
        raise TetherError(f"workers must be a non-empty list of whole numbers >= 1, got {counts!r}")
    counts = [int(p) for p in counts]
    found, hardware, setup = (
        _workload(workload, batch_size),
        _profile(profile),
        _setup(method, counts[0], settings),
    )
    _warn_threads(found, hardware, setup)
    rows = scaling(found, hardware, setup, counts, strong)
    end = curve_end(found, hardware, setup, counts, strong, rows)
    if end is not None:  # the rows stop short: said, not left for the caller to find
        warnings.warn(end, ScalingCutWarning, stacklevel=2)
    return rows


def _warn_threads(workload: Workload, profile: HardwareProfile, setup: Setup) -> None:
    """As ``tether predict`` notes it: layers timed on another thread count than predicted."""
    setup.check()  # a thread count no run takes: its one line, not a note about it
    note = workload.timed_threads_note(profile, setup.threads_per_worker, "threads_per_worker=")
    if note is not None:
        warnings.warn(note.removeprefix("note: "), TimedThreadsWarning, stacklevel=3)


def _count(name: str, value: Any, least: int) -> int:
    """A whole-number argument, as a plain int: a float or a string would be cut or fail deep
    inside (a simulation of ``rounds=2.5`` ran 2 rounds)."""
    if not is_whole(value):
        raise TetherError(f"{name} must be a whole number, got {value!r}")
    if value < least:
        raise TetherError(f"{name} must be at least {least}, got {value}")
    return int(value)


def _plain(value: Any) -> Any:
    """NumPy's numbers as Python's (the checks and predict.json take those); anything else as
    it is, for :meth:`Setup.check` to refuse in its own words."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def method_tau(method: str, given: int | None = None) -> int:
    """``given``, else the method's own default as ``tether train`` runs it (local-sgd and
    async-easgd: 4, two-level-easgd: 4); 1 for a method that exchanges after every step,
    whatever is given (:func:`warn_tau_unused` says so where one is)."""
    if method in EVERY_STEP_METHODS:
        return 1
    if given is not None:
        return given
    return int(method_defaults(method).get("tau", 1))


def warn_tau_unused(
    tau: int | None, methods: list[str], spell: Spell = as_keyword, stacklevel: int = 2
) -> None:
    """A ``tau`` given for methods that exchange after every step: it changes nothing there
    (``spell``: ``--tau`` on the command line; ``stacklevel``: whose line the warning names,
    counted from the caller of this function, 2 being that caller's caller)."""
    unused = [m for m in methods if m in EVERY_STEP_METHODS]
    if tau not in (None, 1) and unused:
        warnings.warn(
            f"{spell('tau')} has no effect on {', '.join(unused)} (each exchanges after every "
            "step)",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def _setup(method: str, workers: int, settings: dict[str, Any]) -> Setup:
    known = set(Setup.__dataclass_fields__) - {"method", "workers"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TetherError(
            f"unknown setting(s) {', '.join(unknown)}: predict takes {', '.join(sorted(known))}"
        )
    settings = {key: _plain(value) for key, value in settings.items()}
    if settings.get("tau") is not None:  # checked even where it changes nothing (said so)
        settings["tau"] = _count("tau", settings["tau"], 1)
        warn_tau_unused(settings["tau"], [method], stacklevel=3)  # predict's caller
    settings = {**settings, "tau": method_tau(method, settings.get("tau"))}
    return Setup(method=method, workers=_plain(workers), **settings)


def simulate(
    method: str,
    workers: int,
    rounds: int = SIMULATED_ROUNDS,
    step_s: float = SIMULATED_STEP_S,
    *,
    heterogeneity: float = 0.0,
    jitter: float = 0.0,
    straggler_probability: float = 0.0,
    straggler_slowdown: float = 1.0,
    message_s: float = SIMULATED_MESSAGE_S,
    service_s: float = SIMULATED_SERVICE_S,
    tau: int | None = None,
    seed: int = 0,
    worker_factors: Sequence[float] | None = None,
) -> SimulationResult:
    """A discrete-event simulation of an asynchronous or round-robin method
    (:mod:`tether.perf.simulator`): throughput, staleness and the server's utilisation.
    ``worker_factors``: one step-time multiplier per worker (``[4, 1, 1, 1]``: rank 1 is 4x
    slower), on top of the random spreads."""
    workers, rounds, seed = (
        _count("workers", workers, 1),
        _count("rounds", rounds, 1),
        _count("seed", seed, 0),
    )
    if tau is not None:
        tau = _count("tau", tau, 1)
        warn_tau_unused(tau, [method], stacklevel=2)  # the caller of simulate
    try:
        speeds = WorkerSpeeds(
            step_s=step_s,
            heterogeneity=heterogeneity,
            jitter=jitter,
            straggler_probability=straggler_probability,
            straggler_slowdown=straggler_slowdown,
            worker_factors=tuple(_plain(f) for f in worker_factors or ()),
        )
        config = SimulationConfig(
            method=method,
            workers=workers,
            rounds=rounds,
            speeds=speeds,
            message_s=message_s,
            service_s=service_s,
            tau=method_tau(method, tau),
            seed=seed,
        )
        return _simulate(config)
    except ValueError as exc:
        raise TetherError(str(exc)) from None
