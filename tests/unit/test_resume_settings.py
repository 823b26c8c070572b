"""A resume continues the run as it was: a setting its checkpoint was made under (the optimizer,
its rate, the schedule, accumulate, precision, tau, ...) given with another value is refused in
one line naming it and both values, by ``tether train --resume`` and ``tether.fit(resume=True)``
alike, before any worker starts; the run's own value, and what a resume may change (steps,
evaluation, checkpoints, target, timeout, progress), pass. Before, torch's
``optimizer.load_state_dict`` put the run's rate back over another ``--lr`` (config.toml claiming
the new one), another ``--optimizer`` failed in a worker (KeyError: 'step'), and another
``--accumulate`` doubled sync-sgd's global batch and skipped samples."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch

from tether.cli import main
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.train_options import add_train_options, config_from_args


def _run(tmp_path: Path, **values: Any) -> Path:
    """A run directory whose config.toml is a sync-sgd run's (what a resume reads first)."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    settings: dict[str, Any] = {"method": "sync-sgd", "model": "mlp", "dataset": "digits"}
    settings |= {"batch_size": 16, "steps": 40, "checkpoint_every": 10, "out": str(run)}
    (run / "config.toml").write_text(TrainConfig(**settings | values).to_toml())
    return run


def _resume(run: Path, *options: str) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_train_options(parser)
    return config_from_args(parser.parse_args(["--resume", str(run), *options]), str)


CHANGED = [
    (["--lr", "0.5"], "lr 0.5: the run has lr 0.05"),
    (["--momentum", "0.5"], "momentum 0.5: the run has momentum 0.9"),
    (["--weight-decay", "0.01"], "weight_decay 0.01: the run has weight_decay 0.0"),
    (["--optimizer", "adamw"], "optimizer 'adamw': the run has optimizer 'auto'"),
    (["--set", "nesterov=true"], "nesterov true: the run has nesterov false"),
    (["--lr-schedule", "cosine"], "lr_schedule 'cosine': the run has lr_schedule 'constant'"),
    (["--warmup-steps", "5"], "warmup_steps 5: the run has warmup_steps 0"),
    (["--precision", "bf16"], "precision 'bf16': the run has precision 'fp32'"),
    (["--clip-grad-norm", "1"], "clip_grad_norm 1.0: the run has clip_grad_norm unset"),
    (["--tau", "4"], "tau 4: the run has tau 1"),
    (["--seed", "3"], "seed 3: the run has seed 0"),
]


@pytest.mark.parametrize(("options", "said"), CHANGED, ids=[o[0] for o, _ in CHANGED])
def test_train_resume_refuses_another_value_of_a_kept_setting(
    tmp_path: Path, options: list[str], said: str
) -> None:
    run = _run(tmp_path)
    with pytest.raises(TetherError) as caught:
        _resume(run, *options)
    text = str(caught.value)
    assert f"cannot resume {run} with {said}" in text and "\n" not in text, text
    assert "start a new run in another directory" in text


def test_accumulate_is_kept_like_the_batch(tmp_path: Path) -> None:
    """sync-sgd and local-sgd took another --accumulate: a global batch of 32 became 64."""
    for method in ("sync-sgd", "local-sgd"):
        run = _run(tmp_path / method, method=method)
        with pytest.raises(TetherError, match=r"with accumulate 2: the run has accumulate 1"):
            _resume(run, "--accumulate", "2")
        assert _resume(run, "--accumulate", "1").accumulate == 1


def test_every_change_is_named_at_once(tmp_path: Path) -> None:
    with pytest.raises(TetherError) as caught:
        _resume(_run(tmp_path), "--momentum", "0.5", "--set", "weight_decay=0.01")
    assert str(caught.value).startswith(
        f"cannot resume {tmp_path / 'run'} with momentum 0.5, weight_decay 0.01: the run has "
        "momentum 0.9, weight_decay 0.0, "
    )
    assert "leave them out (or give the run's)" in str(caught.value)


def test_the_runs_own_values_and_what_a_resume_may_change_pass(tmp_path: Path) -> None:
    run = _run(tmp_path, lr=0.07, optimizer="adamw")
    same = _resume(run, "--lr", "0.07", "--optimizer", "adamw", "--set", "momentum=0.9")
    assert (same.lr, same.optimizer, same.resume) == (0.07, "adamw", True)
    config = _resume(
        run, "--steps", "80", "--eval-every", "5", "--checkpoint-every", "20", "--timeout",
        "30", "--target", "accuracy>=0.9", "--no-progress", "--set", "fault_rank=-1",
    )  # fmt: skip
    assert (config.steps, config.eval_every, config.checkpoint_every) == (80, 5, 20)
    assert (config.timeout_s, config.target, config.progress) == (30.0, "accuracy>=0.9", False)
    assert (config.lr, config.optimizer) == (0.07, "adamw")  # the run's, not the defaults


def test_a_length_in_epochs_replaces_the_runs_steps(tmp_path: Path) -> None:
    """A run of --steps 40 resumed with --epochs 4 kept its 40 steps (steps win over epochs)
    and said it had nothing left to do."""
    run = _run(tmp_path)  # steps 40
    config = _resume(run, "--epochs", "4")
    assert (config.steps, config.epochs) == (None, 4)
    assert _resume(run, "--epochs", "4", "--steps", "50").steps == 50  # both: steps, as always
    assert _resume(run).steps == 40
    fit_run = _run(tmp_path / "fit", model="Linear", dataset="TensorDataset")
    assert (_fit_config(fit_run, epochs=4).steps, _fit_config(fit_run).steps) == (None, 40)


def test_a_fault_injected_into_the_run_is_not_injected_into_its_resume(tmp_path: Path) -> None:
    run = _run(tmp_path, fault_rank=1, fault_step=25, fault_kind="hang")
    config = _resume(run)
    assert (config.fault_rank, config.fault_step, config.fault_kind) == (-1, 0, "raise")
    assert _resume(run, "--set", "fault_rank=0", "--set", "fault_step=3").fault_step == 3


def test_a_directory_that_is_not_a_run_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(TetherError, match=r"cannot resume \S+missing: no such directory"):
        _resume(tmp_path / "missing")
    with pytest.raises(TetherError, match=r"cannot resume \S+: it holds no config\.toml"):
        _resume(tmp_path)


def test_two_level_easgd_keeps_its_nodes(tmp_path: Path) -> None:
    run = _run(tmp_path, method="two-level-easgd", workers=4, ranks_per_node=2)
    with pytest.raises(TetherError, match="ranks_per_node 4: the run has ranks_per_node 2"):
        _resume(run, "--ranks-per-node", "4")
    sync = _run(tmp_path / "sync", workers=4, ranks_per_node=2, allreduce="hierarchical")
    assert _resume(sync, "--ranks-per-node", "4").ranks_per_node == 4  # a collective's


def test_the_command_line_says_it_in_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path)
    before = (run / "config.toml").read_text()
    code = main(["train", "--resume", str(run), "--optimizer", "adamw", "--steps", "60"])
    stderr = capsys.readouterr().err
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "optimizer 'adamw': the run has optimizer 'auto'" in stderr
    assert (run / "config.toml").read_text() == before and sorted(run.iterdir()) == [
        run / "config.toml"
    ]


def _fit_config(
    run: Path, method: str | None = None, workers: int | None = None, **options: Any
) -> TrainConfig:
    """What ``tether.fit(..., method, workers, out=run, resume=True, **options)`` would run."""
    from tether.api.fit import _config

    data = torch.utils.data.TensorDataset(torch.zeros(64, 4), torch.zeros(64, dtype=torch.long))
    epochs = options.pop("epochs", None)
    args = (method, workers, epochs, None, str(run), None, None, True, options)
    return _config(torch.nn.Linear(4, 2), data, None, None, None, None, *args)[0]


def test_fit_resume_leaves_method_workers_and_epochs_to_the_run(tmp_path: Path) -> None:
    """fit's own defaults (sync-easgd, 2 workers, 1 epoch) went over the run's: a 3-epoch run
    resumed without ``epochs=3`` ended at once, cut short, and config.toml said 1 epoch."""
    run = _run(tmp_path, model="Linear", dataset="TensorDataset", workers=4, epochs=3, steps=None)
    kept = _fit_config(run)
    assert (kept.method, kept.workers, kept.epochs, kept.steps) == ("sync-sgd", 4, 3, None)
    assert _fit_config(run, method="sync-sgd", workers=4, epochs=5).epochs == 5


def test_fit_resume_takes_the_runs_settings_and_refuses_others(tmp_path: Path) -> None:
    run = _run(tmp_path, model="Linear", dataset="TensorDataset", lr=0.07, accumulate=2)
    kept = _fit_config(run)  # what the call leaves out is the run's, as under tether train
    assert (kept.lr, kept.accumulate, kept.batch_size, kept.resume) == (0.07, 2, 16, True)
    assert _fit_config(run, lr=0.07, steps=60).steps == 60
    with pytest.raises(TetherError, match=r"with lr 0\.5: the run has lr 0\.07.*leave lr out"):
        _fit_config(run, lr=0.5)
    with pytest.raises(TetherError, match=r"with accumulate 1: the run has accumulate 2"):
        _fit_config(run, accumulate=1)
    with pytest.raises(TetherError, match=r"with optimizer 'adamw': the run has optimizer 'auto'"):
        _fit_config(run, optimizer="adamw")


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-3)


def test_a_rate_the_users_own_optimizer_sets_is_not_the_runs_to_keep(tmp_path: Path) -> None:
    # The run's AdamW factory sets its own rate (summary.json: 0.003); resuming with lr=0.5 was
    # refused naming "the run has lr 0.05", a default the run never used. Now the
    # rate is left to the factory (and the warning about ignored settings says lr does nothing)
    from tether.api.fit import _config

    run = _run(tmp_path, model="Linear", dataset="TensorDataset", lr_base_batch=0)
    data = torch.utils.data.TensorDataset(torch.zeros(64, 4), torch.zeros(64, dtype=torch.long))
    args = (None, None, None, None, str(run), None, None, True, {"lr": 0.5})
    model = torch.nn.Linear(4, 2)
    config = _config(model, data, None, _adamw, None, None, *args)[0]
    assert config.resume
    with pytest.raises(TetherError, match=r"with lr 0\.5: the run has lr 0\.05"):
        _config(model, data, None, None, None, None, *args)  # the method's own SGD: its rate


def test_a_parallel_plan_written_another_way_is_the_same_plan(tmp_path: Path) -> None:
    # Before: "cannot resume ... with parallel_plan ['fc1=column', 'fc2=row']: the run has
    # parallel_plan ['fc1=column,fc2=row']", the same two splits written another way.
    run = _run(tmp_path, workers=4, model_parallel=2, parallel_plan=("fc1=column,fc2=row",))
    same = _resume(run, "--parallel-plan", " fc2=row , fc1=column")
    assert same.model_parallel == 2
    with pytest.raises(TetherError, match=r"parallel_plan .*: the run has parallel_plan"):
        _resume(run, "--parallel-plan", "fc1=column")


def test_repeated_parallel_plans_add_up() -> None:
    # Before, a second --parallel-plan replaced the first without a word.
    parser = argparse.ArgumentParser()
    add_train_options(parser)
    argv = ["--method", "sync-sgd", "--workers", "2", "--model-parallel", "2"]
    argv += ["--parallel-plan", "fc1=column", "--parallel-plan", "fc2=row"]
    config = config_from_args(parser.parse_args(argv), str)
    assert config.parallel_plan == ("fc1=column", "fc2=row")


def test_a_refused_rate_the_run_scaled_says_which_rate_the_config_holds(tmp_path: Path) -> None:
    # sync-sgd's default rate is held at lr_base_batch 256 and scaled to the run's batch: a user
    # who gave the rate summary.json shows (0.05) was told "the run has lr 0.1" (a docs review).
    run = _run(tmp_path, lr=0.1, lr_base_batch=256)
    with pytest.raises(TetherError) as caught:
        _resume(run, "--lr", "0.05")
    assert (
        "with lr 0.05: the run has lr 0.1 (its rate at a batch of lr_base_batch 256, which the "
        "run scales to its own batch: summary.json's lr is the one it took)"
    ) in str(caught.value)
