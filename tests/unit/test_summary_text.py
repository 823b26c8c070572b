"""What a run tells its user on the terminal: the end-of-run summary, the progress bar, warnings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tether.observe.summary import run_summary_text


def _text(tmp_path: Path, **change: Any) -> str:
    summary = {
        "method": "sync-sgd",
        "workers": 2,
        "model": "lenet5",
        "dataset": "fashion-mnist",
        "steps": 20,
        "epochs": 0.04,
        "wall_time_s": 1.1,
        "training_time_s": 0.5,
        "samples_per_s": 4964.0,
        "comm_fraction": 0.06,
        "final_test_accuracy": 0.1,
        **change,
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    return run_summary_text(tmp_path)


def test_fp16_steps_skipped_for_an_overflow_are_said(tmp_path: Path) -> None:
    # A loss scale above fp16's range skipped every step: 10% accuracy, status 0, not a word
    assert "wall time 1.1 s, training 0.5 s  (4964 samples/s)" in _text(tmp_path)
    every = _text(tmp_path, fp16_skipped_steps=20)
    assert "fp16: every step (20) overflowed and was skipped: nothing trained" in every
    some = _text(tmp_path, fp16_skipped_steps=3)
    assert "fp16: 3 of 20 steps skipped for an overflow" in some
    assert "fp16:" not in _text(tmp_path, fp16_skipped_steps=0)
    assert "fp16:" not in _text(tmp_path, fp16_skipped_steps=None)


def test_the_progress_bar_says_its_accuracy_is_the_tests() -> None:
    # "acc=0.66" stood next to the training "loss=2.171" (the test loss was 2.03)
    from tether.training.server_progress import evaluation_postfix

    assert evaluation_postfix(None, {"accuracy": 0.66, "loss": 2.03}) == {"test_acc": "0.660"}
    assert evaluation_postfix(None, {"loss": 2.03}) == {"test_loss": "2.030"}


def test_a_run_that_ended_short_says_of_how_many(tmp_path: Path) -> None:
    # an asynchronous run that carried on without a lost worker said "22 steps"
    assert "fashion-mnist: 22 of 40 steps (" in _text(tmp_path, steps=22, planned_steps=40)
    assert "fashion-mnist: 20 steps (" in _text(tmp_path, planned_steps=20)


def test_a_resume_that_counts_no_earlier_samples_leaves_out_their_training_time_once() -> None:
    # the time before the checkpoint was left out with its evaluations, which the training
    # clock leaves out already: samples_per_s came out too high
    from tether.training.run_record import RunRecord

    saved = {"step": 10, "elapsed_s": 8.0, "eval_s": 3.0, "history": [], "time_to_target_s": None}
    record = RunRecord.resumed(saved)
    record.count_nothing_before()
    assert record.uncounted_s == 5.0


def test_torchrun_says_when_a_nodes_processes_outnumber_its_cores(tmp_path: Path) -> None:
    # tether train said so; -m tether.run under torchrun --nproc-per-node 3 on 2 cores did not
    import warnings

    from tether.catalog import OversubscribedWarning
    from tether.cli import OneLineParser
    from tether.launch.env import DistEnv
    from tether.launch.partition import usable_cores
    from tether.run import worker_config
    from tether.train_options import add_train_options

    parser = OneLineParser(prog="python -m tether.run")
    add_train_options(parser)
    args = parser.parse_args(["--method", "sync-sgd", "--out", str(tmp_path / "run")])
    many = len(usable_cores()) + 1
    for local_rank, said in ((0, True), (1, False)):  # once a node
        env = DistEnv(local_rank, many, local_rank, many, "127.0.0.1", 29500, None)
        with warnings.catch_warnings(record=True) as heard:
            warnings.simplefilter("always")
            worker_config(args, env)
        oversubscribed = [w for w in heard if issubclass(w.category, OversubscribedWarning)]
        assert bool(oversubscribed) is said, [str(w.message) for w in heard]


def test_the_first_line_names_the_communication_settings_changed() -> None:
    # a run said nothing of --allreduce ring, --compress fp16 or --bucket-mb 0 (config.toml did)
    from tether.cli import communication_text
    from tether.config import TrainConfig
    from tether.methods import METHODS

    sync_sgd = METHODS.get("sync-sgd").settings
    changed = TrainConfig(method="sync-sgd", allreduce="ring", compress="fp16", bucket_mb=0.0)
    said = communication_text(changed, sync_sgd)
    assert said == ", all-reduce ring, fp16 on the wire, one message per parameter"
    assert communication_text(TrainConfig(method="sync-sgd"), sync_sgd) == ""
    # a setting the method does not use is warned of elsewhere, not named here
    async_sgd = METHODS.get("async-sgd").settings
    assert communication_text(TrainConfig(method="async-sgd", compress="fp16"), async_sgd) == ""
