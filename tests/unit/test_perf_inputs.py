"""What ``tether predict`` and ``tether.predict`` take from their inputs and say about them: which
workload a profile file lends (by name or by the same layers), the thread count its layers were
timed on, a data set smaller than the batch, the held-batch note past train's worker cap, the
recommended bucket, and a profile path that is a directory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tether import perf_workloads
from tether.api.calibrate import model_name
from tether.api.perf import predict, time_model
from tether.batch_notes import held_batches_note
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.perf.profile import load_profile, profile_from_dict
from tether.perf.workload import LayerCost, TimedThreadsWarning, Workload

HARDWARE = load_profile("vm-2cores").to_dict()


def _layers(width: int = 256) -> tuple[LayerCost, ...]:
    return (
        LayerCost("1", (20 * width * 4, width * 4), 64 * 20 * width * 2, 1e-4, 2e-4),
        LayerCost("3", (width * 3 * 4, 12), 64 * width * 3 * 2, 5e-5, 1e-4),
    )


def _workload(model: str, measured_on: str = "", threads: int = 0, **kw) -> Workload:
    return Workload(model, 64, _layers(**kw), 2e-4, measured_on, threads=threads)


def _file(tmp_path: Path, stored: Workload, name: str = "here") -> Path:
    path = tmp_path / "profile.json"
    hardware = {**HARDWARE, "name": name}
    path.write_text(json.dumps({"hardware": hardware, "workload": stored.to_dict()}))
    return path


def _config(model: str = "mypkg.nets:build", batch: int = 64) -> TrainConfig:
    return dataclasses.replace(TrainConfig(), model=model, batch_size=batch)


def _counted(monkeypatch: pytest.MonkeyPatch, counted: Workload) -> None:
    """The model built and its FLOPs counted here: a stand-in (no model is built)."""
    monkeypatch.setattr(perf_workloads, "timed_workload", lambda *a, **k: (counted, 0.0))


def test_a_python_calibrations_file_lends_its_timed_layers_to_the_same_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tether.calibrate named the workload by its class ("Sequential"), which --model
    mypkg.nets:build never equals: predict used counted FLOPs. The same layers now count."""
    path = _file(tmp_path, _workload("Sequential", "here", threads=1))
    _counted(monkeypatch, _workload("mypkg.nets:build"))
    used = perf_workloads.workload_for(_config(), str(path), "here")
    assert used.workload.measured_on == "here" and used.workload.batch_size == 64
    assert used.source == (
        "timed layers of the profile's workload 'Sequential': the same layers and parameters"
    )
    # another model (other parameters) is priced from its own counted FLOPs
    _counted(monkeypatch, _workload("mypkg.nets:build_big", width=4096))
    used = perf_workloads.workload_for(_config("mypkg.nets:build_big"), str(path), "here")
    assert used.source == "counted FLOPs" and used.workload.measured_on == ""


def test_a_file_of_the_same_name_needs_no_model_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path, _workload("mypkg.nets:build", "here"))
    monkeypatch.setattr(perf_workloads, "timed_workload", None)  # calling it fails the test
    used = perf_workloads.workload_for(_config(batch=32), str(path), "here")
    assert used.source == "timed layers" and used.workload.batch_size == 32


def test_the_python_calibration_names_a_factory_by_its_import_path() -> None:
    """So that `tether predict --model module:factory` finds the file's layers by name."""

    def local() -> nn.Module:
        return nn.Linear(2, 2)

    net = nn.Sequential(nn.Linear(2, 2))
    assert model_name(_config, net) == f"{__name__}:_config"
    assert model_name(net, net) == "Sequential"  # a module object: its class
    assert model_name(local, net) == "Sequential"  # not importable by a path
    assert model_name(lambda: net, net) == "Sequential"


def test_a_data_set_smaller_than_the_batch_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its first batch, all of it, was predicted as the batch per worker without a word."""
    _counted(monkeypatch, dataclasses.replace(_workload("m:f").at_batch(10)))
    used = perf_workloads.workload_for(_config("m:f"), "p40-cluster", "p40-cluster")
    assert used.workload.batch_size == 10
    assert used.notes == (
        "note: the data set holds fewer samples than a batch of 64: predicting its first "
        "batch, 10 per worker (--batch-size 10 to ask for it, or a larger data set)",
    )
    _counted(monkeypatch, _workload("m:f"))
    assert perf_workloads.workload_for(_config("m:f"), "p40-cluster", "p40-cluster").notes == ()


def test_layers_timed_on_another_thread_count_are_noted() -> None:
    profile = profile_from_dict({**HARDWARE, "name": "here"})
    one = _workload("m", "here", threads=1)
    option = "--threads-per-worker"
    assert one.timed_threads_note(profile, 1, option) is None
    assert one.timed_threads_note(profile, 2, option) == (
        "note: profile here's layers were timed on 1 thread(s) per worker and are used as "
        "timed at --threads-per-worker 2, which only counts more cores per worker: calibrate "
        "with --threads-per-worker 2 to predict that many threads"
    )
    # counted FLOPs (another profile) are no timing on threads
    assert _workload("m", "elsewhere", threads=1).timed_threads_note(profile, 2, option) is None
    # a file from before the count was kept: unknown, said where more than 1 is predicted
    unknown = _workload("m", "here")
    assert unknown.timed_threads_note(profile, 1, option) is None
    assert "an unrecorded number of thread(s)" in str(
        unknown.timed_threads_note(profile, 2, option)
    )
    with pytest.warns(TimedThreadsWarning, match="at threads_per_worker=2, which only"):
        predict(one, "sync-sgd", 1, profile, threads_per_worker=2)


def test_the_timed_thread_count_is_recorded_and_kept() -> None:
    net = nn.Sequential(nn.Linear(8, 4))
    timed = time_model(net, torch.randn(4, 8), torch.tensor([0, 1, 2, 3]), F.cross_entropy,
                       threads=1, repeats=1)  # fmt: skip
    assert timed.threads == 1
    assert Workload.from_dict(timed.to_dict()).threads == 1
    assert timed.at_batch(8).threads == 1
    old = {k: v for k, v in timed.to_dict().items() if k != "threads"}
    assert Workload.from_dict(old).threads == 0  # unknown
    with pytest.raises(TetherError, match="'threads' must be a whole number >= 0, not -1"):
        Workload.from_dict({**old, "threads": -1})


def test_the_held_batch_note_has_no_worker_cap() -> None:
    """Predictions are modelling only: 8192 workers failed with train's "workers must be <=
    4096" when the note asked the config what train would run."""
    assert held_batches_note(["sync-sgd"], [8192], 64) is None
    note = held_batches_note(["async-easgd"], [4, 4096, 8192], 64)
    assert note is not None and "async-easgd: 32 on 4, 16 on 4096 to 8192 workers" in note


def test_a_tie_keeps_the_bucket_and_one_worker_gets_no_recommendation() -> None:
    """One gradient tensor: every bucket is one message and the same time; the smallest
    candidate (0) was recommended. On one worker nothing is communicated at all."""
    profile = load_profile("vm-2cores")
    one = Workload("m", 64, (LayerCost("a", (4096,), 1e6, 1e-3, 2e-3),), 1e-4, profile.name)
    for bucket in (1.0, 2.0, 3.0):
        details = predict(one, "sync-sgd", 2, profile, bucket_mb=bucket).details
        assert details["recommended_bucket_mb"] == bucket
    alone = predict(one, "sync-sgd", 1, profile).details
    assert alone["recommended_bucket_mb"] is None and alone["recommended_s"] is None
    assert "best --bucket-mb" not in perf_workloads.sync_sgd_line(alone)
    # a real difference is still recommended: many small tensors on slow start-ups fuse
    many = Workload(
        "m", 64, tuple(LayerCost(str(i), (4096,), 1e6, 1e-4, 1e-4) for i in range(32)), 0.0,
        profile.name,
    )  # fmt: skip
    assert predict(many, "sync-sgd", 2, profile, bucket_mb=0.0).details["recommended_bucket_mb"] > 0


def test_without_overlap_the_overlapped_schedules_are_said_to_be_what_ifs() -> None:
    profile = load_profile("vm-2cores")
    details = predict(_workload("m"), "sync-sgd", 2, profile, overlap=False).details
    line = perf_workloads.sync_sgd_line(details)
    assert line.startswith(f"naive {details['naive_s'] * 1e3:.3f} ms (overlap is off: what runs)")
    assert "; if overlapped: wait-free backprop" in line
    on = perf_workloads.sync_sgd_line(predict(_workload("m"), "sync-sgd", 2, profile).details)
    assert "overlap is off" not in on and ", wait-free backprop" in on


def test_a_profile_directory_is_said_to_be_one(tmp_path: Path) -> None:
    with pytest.raises(TetherError, match=f"profile {tmp_path} is a directory: give the profile"):
        load_profile(str(tmp_path))


def test_numpys_numbers_are_taken_as_pythons() -> None:
    """The whole-number checks refused np.int64 (np.arange's) and np.float32, which predicted
    before they were added; they are taken as plain numbers (predict.json holds those)."""
    import numpy as np

    from tether.api.perf import predict_scaling, simulate

    workload = _workload("toy")
    pred = predict(workload, "sync-sgd", np.int64(2), "p40-cluster", bucket_mb=np.float32(1.0))
    assert pred.iteration_s > 0
    rows = predict_scaling(workload, "sync-sgd", "p40-cluster", workers=list(np.arange(1, 4)))
    assert [type(row["workers"]) for row in rows] == [int, int, int]
    result = simulate("async-sgd", np.int64(4), np.int64(10), 0.01)
    assert type(result.workers) is int and result.throughput_steps_s > 0
    with pytest.raises(TetherError, match="workers must be a whole number"):
        predict(workload, "sync-sgd", np.float64(2.5), "p40-cluster")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        # a string or None was math's "TypeError: must be real number, not str"
        ({"step_s": "0.01"}, "step_s = '0.01' is not a finite number"),
        ({"message_s": None}, "message_s = None is not a finite number"),
        ({"straggler_probability": "a"}, "straggler_probability = 'a' is outside [0, 1]"),
        ({"worker_factors": [1, "a"]}, "worker_factors must all be > 0"),
        # the internal field's name leaked: "speeds.worker_factors has 1 entries"
        ({"worker_factors": [1.0]}, "worker_factors has 1 entries for 2 workers"),
    ],
)
def test_a_simulation_setting_of_the_wrong_kind_is_one_line(given: dict, said: str) -> None:
    from tether.api.perf import simulate

    with pytest.raises(TetherError, match=None) as refused:
        simulate("async-sgd", 2, 10, **given)
    assert str(refused.value).startswith(said) or f": {said}" in str(refused.value), refused.value


def test_the_calibration_summary_gives_one_value_where_one_run_was_timed() -> None:
    from tether.perf_commands import _spread_ms

    assert _spread_ms([0.00041]) == "0.41"  # was "0.41-0.41 ms/step over 1 runs"
    assert _spread_ms([0.00041, 0.00052, 0.00045]) == "0.41-0.52"
