"""The workload ``tether calibrate`` times and ``tether predict`` prices, and the lines that say
which one a prediction used: a profile file's timed layers, or the model's FLOPs counted here.

A file names its model as its writer knew it: the command writes the ``--model`` typed (an
import path, ``mypkg.nets:build``), ``tether.calibrate`` the factory's import path or, for a
module object, its class name (``Sequential``). So a file's timed layers are used when the name
matches, or when the model built here has the same layers, parameters and FLOPs per sample
(:meth:`~tether.perf.workload.Workload.same_layers`), and the first line says which it was.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.config import TrainConfig
from tether.perf.workload import TimedThreadsWarning, Workload


def timed_workload(config: TrainConfig, profile_name: str, repeats: int) -> tuple[Any, float]:
    """The configured model's training step on one batch of the configured data, timed."""
    import torch

    from tether.api.calibrate import first_batch
    from tether.bench.calibrate import time_model
    from tether.catalog import task_from_config
    from tether.training.probe import build_model

    torch.manual_seed(config.seed)
    task = task_from_config(config)
    model = build_model(task)  # a factory that fails: one line
    inputs, targets = first_batch(task.train_data, config.batch_size, task.collate_fn)
    params = model.parameters()
    optimizer = (
        task.optimizer(params) if task.optimizer else torch.optim.SGD(params, lr=0.01, momentum=0.9)
    )
    return time_model(
        model,
        inputs,
        targets,
        task.loss,
        optimizer,
        config.model,
        profile_name,
        max(1, config.threads_per_worker),
        repeats,
    )


@dataclass(frozen=True)
class PredictedWorkload:
    """The workload predicted, and the words for where its times come from."""

    workload: Workload
    source: str
    notes: tuple[str, ...] = ()


def workload_for(config: TrainConfig, profile_path: str, profile_name: str) -> PredictedWorkload:
    """The profile file's own timed workload when it is of this model (by name, or the same
    layers: any batch, scaled); otherwise the model's FLOPs counted here (times from the
    profile's FLOP/s)."""
    stored = _stored_workload(Path(profile_path))
    if stored is not None and stored.model == config.model:
        return _timed(stored.at_batch(config.batch_size), profile_name, "")
    counted, _ = timed_workload(config, "", repeats=2)
    # the first batch of a data set smaller than the batch is all of it: say so, not silently
    notes = (
        (
            f"note: the data set holds fewer samples than a batch of {config.batch_size}: "
            f"predicting its first batch, {counted.batch_size} per worker (--batch-size "
            f"{counted.batch_size} to ask for it, or a larger data set)",
        )
        if counted.batch_size < config.batch_size
        else ()
    )
    if stored is not None and stored.same_layers(counted):
        used = stored.at_batch(counted.batch_size)
        how = f" of the profile's workload '{stored.model}': the same layers and parameters"
        return _timed(used, profile_name, how, notes)
    return PredictedWorkload(counted, "counted FLOPs", notes)


def _timed(
    workload: Workload, profile_name: str, how: str, notes: tuple[str, ...] = ()
) -> PredictedWorkload:
    # a file's workload timed on another profile than the file's (an edited name) is priced
    # from its FLOPs (Workload.step_times): say that, not "timed"
    if workload.measured_on != profile_name:
        return PredictedWorkload(workload, f"counted FLOPs{how}", notes)
    return PredictedWorkload(workload, f"timed layers{how}", notes)


def stored_model(profile_path: str) -> str | None:
    """The model a profile file's timed workload is of (a file from ``tether calibrate``);
    None for a built-in profile or a file without one."""
    stored = _stored_workload(Path(profile_path))
    return stored.model if stored is not None else None


def _stored_workload(path: Path) -> Workload | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    stored = data.get("workload") if isinstance(data, dict) else None
    if stored is None:
        return None
    # checked even when of another model: the file is damaged
    return Workload.from_dict(stored, str(path))


def sync_sgd_line(details: dict[str, Any]) -> str:
    """sync-sgd's schedules beside the one predicted. Wait-free backprop and MG-WFBP overlap
    communication with backward by definition: where overlap is off (``--no-overlap``, or an
    oversubscribed node with no core to spare) they are said to be what overlap would give, and
    the run gets the naive time. No bucket size is recommended where nothing is communicated."""
    naive = f"naive {details['naive_s'] * 1e3:.3f} ms"
    messages = details["mg_wfbp_messages"]
    overlapped = (
        f"wait-free backprop {details['wfbp_s'] * 1e3:.3f} ms, MG-WFBP "
        f"{details['mg_wfbp_s'] * 1e3:.3f} ms ({messages} message{'s' if messages != 1 else ''})"
    )
    if details["overlap_effective"]:
        line = f"{naive}, {overlapped}"
    else:
        line = f"{naive} (overlap is off: what runs); if overlapped: {overlapped}"
    best = details["recommended_bucket_mb"]
    bucket = f"; best --bucket-mb {best:g}" if best is not None else ""
    return line + bucket


def predict(*args: Any, **kwargs: Any) -> Any:
    """:func:`tether.api.perf.predict` without its thread-count warning, which ``tether
    predict`` prints once, as a note naming its own option."""
    from tether.api.perf import predict as predicted

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TimedThreadsWarning)
        return predicted(*args, **kwargs)


def predict_scaling(*args: Any, **kwargs: Any) -> Any:
    """:func:`tether.api.perf.predict_scaling`, as :func:`predict`."""
    from tether.api.perf import predict_scaling as curve

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TimedThreadsWarning)
        return curve(*args, **kwargs)
