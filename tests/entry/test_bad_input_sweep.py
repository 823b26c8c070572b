"""A sweep of bad input across every command: each must end in one line on stderr starting with
``tether: error:``, exit code 2, no traceback, and nothing started (the launchers are replaced by
a trap that fails the test if a case gets that far). In-process: the whole sweep takes seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.cli import main

BIG = str(2**70)
INT_OPTIONS = {
    "--workers": ["0", "-1", "abc", "1.5", "100000"],
    "--epochs": ["0", "-1", "abc", BIG],
    "--steps": ["0", "-3", "2.5", BIG],
    "--batch-size": ["0", "-8", "x", BIG],
    "--seed": ["-1", BIG, "one"],
    "--eval-every": ["-1", "abc", BIG],
    "--ranks-per-node": ["-1", "abc"],
    "--checkpoint-every": ["-1", "x", BIG],
    "--warmup-steps": ["-1", "x", BIG],
    "--accumulate": ["0", "-2", "x", BIG],
    "--tau": ["0", "-1", "x", BIG],
    "--staleness-bound": ["-1", "x"],
}
FLOAT_OPTIONS = {
    "--lr": ["inf", "nan", "-1", "0", "x", "1e309"],
    "--momentum": ["-0.1", "1.5", "nan", "inf"],
    "--weight-decay": ["-1", "nan", "inf"],
    "--target-accuracy": ["1.5", "-0.1", "nan"],
    "--bucket-mb": ["-1", "nan", "inf"],
    "--timeout": ["0", "-5", "inf", "nan", "1e-9", "x"],
    "--clip-grad-norm": ["-1", "nan", "0"],
    "--warmup-epochs": ["-1", "nan", "inf"],
    "--alpha": ["-0.1", "nan", "inf", "1.5"],
    "--rho": ["-1", "nan", "inf"],
}
NAME_OPTIONS = {
    "--method": ["sgd", ""],
    "--model": ["vgg", "nosuchmodule:Net", "tether.models:NoSuchThing"],
    "--dataset": ["imagenet"],
    "--backend": ["mpi2", "nccl"],
    "--allreduce": ["fastest"],
    "--compress": ["int4"],
    "--optimizer": ["adamax9", "nosuchmodule:make"],
    "--lr-schedule": ["linear9"],
    "--loss": ["hinge9"],
    "--precision": ["fp8"],
    "--target": ["accuracy>>0.9", "speed>=3", "accuracy>="],
    "--metric": ["auc9"],
}
OTHER_TRAIN = [
    ["--set", "fault_rank=7", "--workers", "3"],
    ["--set", "resume=true"],
    ["--set", "nokey=1"],
    ["--set", "lr"],
    ["--set", "lr=[1"],
    ["--set", "workers='two'"],
    ["--batch-size", "70000", "--workers", "2"],  # a global batch larger than the data set
    ["--method", "hierarchical-sgd"],
    ["--out", ""],
    ["--out", "/proc/tether-run"],
    ["--resume", "/nonexistent"],
    ["--config", "/nonexistent.toml"],
    ["--data-dir", "/nonexistent"],
    ["--unknown-flag"],
    ["--steps"],
]


# The user's own components that fail as the CLI builds them (tests write them to a package)
USER_PACKAGE = {
    "nets.py": (
        "import torch\n"
        "def build():\n    return torch.nn.Linear(10, 1)\n"
        "def needs_arg(width):\n    return torch.nn.Linear(10, width)\n"
        "def raises():\n    raise RuntimeError('factory blew up')\n"
        "def no_params():\n    return None\n"
    ),
    "data.py": (
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "def load():\n    x = torch.randn(256, 10)\n"
        "    return TensorDataset(x, x[:, 0]), TensorDataset(x[:32], x[:32, 0])\n"
        "def missing_file():\n    return open('/nonexistent/data.csv')\n"
    ),
}
REGRESSION = ["--dataset", "userpkg.data:load", "--loss", "mse"]
USER_CASES = [
    ["train", "--model", "userpkg.nets:needs_arg", *REGRESSION],
    ["train", "--model", "userpkg.nets:raises", *REGRESSION],
    ["train", "--model", "userpkg.nets:build", "--dataset", "userpkg.data:missing_file"],
    # an optimizer factory that takes no parameters: caught before launch, as tether.fit does
    ["train", "--dataset", "digits", "--optimizer", "userpkg.nets:build"],
    ["train", "--target", "accuracy>=90", "--out", "runs/percent"],  # never reached
    ["train", "--stop-at-target", "--out", "runs/no-target"],  # nothing to stop at
    # a regression model timed with the default cross-entropy: one line, pointing at --loss
    ["predict", "--model", "userpkg.nets:build", "--dataset", "userpkg.data:load"],
    ["predict", "--model", "userpkg.nets:needs_arg", *REGRESSION],
]


def _train_cases(tmp: Path) -> list[list[str]]:
    cases = [["train", flag, value] for flag, values in INT_OPTIONS.items() for value in values]
    cases += [["train", flag, value] for flag, values in FLOAT_OPTIONS.items() for value in values]
    cases += [["train", flag, value] for flag, values in NAME_OPTIONS.items() for value in values]
    cases += [["train", *argv] for argv in OTHER_TRAIN]
    (tmp / "file").write_text("x")
    (tmp / "binary.toml").write_bytes(bytes(range(256)) * 4)
    (tmp / "bad.toml").write_text("workers = [\n")
    (tmp / "run").mkdir()
    (tmp / "run" / "summary.json").write_text("{}")
    cases += [
        ["train", "--out", str(tmp / "file" / "run")],
        ["train", "--out", str(tmp / "file")],
        ["train", "--out", str(tmp / "run")],
        ["train", "--config", str(tmp / "binary.toml")],
        ["train", "--config", str(tmp / "bad.toml")],
        ["train", "--config", str(tmp)],
    ]
    return cases


OTHER_COMMANDS = [
    ["compare", "--methods", "sync-sgd,nosuch"],
    ["compare", "--methods", ""],
    ["compare", "--method", "sync-sgd"],
    ["compare", "--methods", "sync-sgd", "--resume", "/tmp"],
    ["compare", "--methods", "sync-sgd", "--lr", "nan"],
    ["compare", "--methods", "sync-sgd", "--workers", "0"],
    ["bench", "comm", "--sizes", "1024GB"],
    ["bench", "comm", "--sizes", "0"],
    ["bench", "comm", "--sizes", "-4KB"],
    ["bench", "comm", "--sizes", "4KB:1KB"],
    ["bench", "comm", "--sizes", "lots"],
    ["bench", "comm", "--op", "scatter9"],
    ["bench", "comm", "--algo", "nosuch"],
    ["bench", "comm", "--workers", "0"],
    ["bench", "comm", "--workers", "-2"],
    ["bench", "comm", "--workers", "5000"],
    ["bench", "comm", "--repeats", "0"],
    ["bench", "comm", "--repeats", BIG],
    ["bench", "comm", "--timeout", "nan"],
    ["bench", "comm", "--timeout", "0"],
    ["bench", "comm", "--transport", "pigeon"],
    ["bench", "comm", "--backend", "nccl"],
    ["bench", "comm", "--nodes", "0"],
    ["bench", "comm", "--nodes", "3", "--workers", "2"],
    ["bench", "comm", "--link-mbit", "-1"],
    ["bench", "comm", "--link-mbit", "nan"],
    ["bench", "nosuch"],
    ["launch", "/nonexistent/script.py"],
    ["launch", "--workers", "0", "script.py"],
    ["launch", "--method", "nosuch", "script.py"],
    ["list", "gadgets"],
    ["nosuchcommand"],
]


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any case that gets as far as starting processes."""

    def trap(*args: object, **kwargs: object) -> None:
        raise AssertionError("a bad input reached the launcher")

    import torch.distributed.launcher.api as launcher_api

    import tether.launch.local as local

    monkeypatch.setattr(launcher_api, "elastic_launch", trap)
    monkeypatch.setattr(local, "elastic_launch", trap)


def test_every_bad_input_is_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    no_launch: None,
) -> None:
    monkeypatch.chdir(tmp_path)  # default run directories (runs/...) land here
    (tmp_path / "script.py").write_text("print('hi')\n")
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    for name, text in USER_PACKAGE.items():
        (tmp_path / "userpkg" / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = _train_cases(tmp_path) + OTHER_COMMANDS + USER_CASES
    assert len(cases) >= 100, len(cases)
    broken = []
    for argv in cases:
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
        except BaseException as exc:
            code = f"raised {type(exc).__name__}: {str(exc)[:150]}"
        err = capsys.readouterr().err.strip().splitlines()
        ok = code == 2 and len(err) == 1 and err[0].startswith("tether: error: ")
        if not ok:
            broken.append(f"{argv}: exit {code}, stderr {err[-3:]}")
    assert broken == [], f"{len(broken)} of {len(cases)} cases broke the contract:\n" + "\n".join(
        broken
    )


def test_more_processes_than_cores_warns_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from tether.catalog import OversubscribedWarning, check_launch
    from tether.config import TrainConfig

    cores = len(os.sched_getaffinity(0))
    with pytest.warns(OversubscribedWarning, match=f"{cores + 1} processes on {cores} cores"):
        check_launch(TrainConfig(method="sync-sgd", workers=cores + 1))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_launch(TrainConfig(method="sync-sgd", workers=cores))  # no warning


def test_compare_stops_at_its_own_default_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_launch: None
) -> None:
    # `tether compare --stop-at-target` gives its runs a default target after the config is
    # read: the check that a run told to stop has a target must not refuse it (it did, briefly)
    monkeypatch.chdir(tmp_path)
    argv = ["compare", "--methods", "sync-sgd", "--stop-at-target", "--steps", "5"]
    with pytest.raises(AssertionError, match="reached the launcher"):
        main(argv)
