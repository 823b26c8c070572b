"""Bad input on the command line: one line on stderr, exit code 2, no traceback, nothing started."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tether.cli import main


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tether: error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "sgd"], "unknown method 'sgd'; valid methods: "),
        (["--model", "vgg"], "unknown model 'vgg'; valid models: "),
        (["--dataset", "imagenet"], "unknown dataset 'imagenet'; valid datasets: "),
        # a value refused is named as the option typed (it was the config key: batch_size)
        (["--workers", "0"], "error: --workers must be >= 1"),
        (["--batch-size", "0"], "error: --batch-size must be >= 1"),
        (["--lr", "0"], "error: --lr must be > 0"),
        (["--lr", "-0.1"], "error: --lr must be > 0"),
        (["--checkpoint-every", "-1"], "error: --checkpoint-every must be >= 0, got -1"),
        (["--timeout", "0"], "error: --timeout must be >= 1 s"),
        (["--precision", "fp8"], "error: --precision must be fp32, bf16 or fp16, got 'fp8'"),
        # ... and as the key where the user wrote the key
        (["--set", "eval_every=-2"], "error: eval_every must be >= 0, got -2"),
        # every setting a refusal names, each as the user gave it
        (
            ["--workers", "6", "--ranks-per-node", "4"],
            "error: --workers (6) must be a multiple of --ranks-per-node (4)",
        ),
        (
            ["--set", "workers=6", "--ranks-per-node", "4"],
            "error: workers (6) must be a multiple of --ranks-per-node (4)",
        ),
        (
            ["--set", "learning_rate=0.1"],
            "unknown config key 'learning_rate' (did you mean 'lr'?); every key: docs/options.md",
        ),
        (
            ["--dataset", "digits", "--batch-size", "600", "--set", "accumulate=2"],
            "(2 workers x batch 600 x accumulate 2 = 2400) is larger than the training set (1500 "
            "samples): lower --batch-size, --workers or --accumulate",
        ),
        # the value refused, where the rule did not say it
        (["--clip-grad-norm", "-1"], "error: --clip-grad-norm must be > 0, got -1.0"),
        (["--set", "loss_scale=0"], "error: loss_scale must be > 0, got 0.0"),
        (["--config", "/nonexistent/run.toml"], "cannot read config file /nonexistent/run.toml"),
        (["--resume", "/nonexistent"], "cannot resume /nonexistent: no such directory"),
        # it said the missing directory holds no checkpoint.pt: start it again with --overwrite
        (
            ["--set", "resume=true", "--out", "/nonexistent/run"],
            "cannot resume /nonexistent/run: no such directory; leave resume out",
        ),
    ],
)
def test_bad_options(capsys, argv: list[str], message: str) -> None:
    assert message in _error_line(capsys, ["train", *argv])


def test_data_dir_without_files_says_how_to_get_them(capsys, tmp_path: Path) -> None:
    line = _error_line(capsys, ["train", "--data-dir", str(tmp_path)])
    assert str(tmp_path) in line and "apt-get install dataset-fashion-mnist" in line


def test_corrupt_idx_file_is_named(capsys, tmp_path: Path) -> None:
    for name in ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte"):
        # A valid header announcing 10 images of 28x28, with a truncated payload.
        header = bytes([0, 0, 8, 3]) + (10).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
        with gzip.open(tmp_path / f"{name}.gz", "wb") as handle:
            handle.write(header + bytes(100))
    for name in ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"):
        with gzip.open(tmp_path / f"{name}.gz", "wb") as handle:
            handle.write(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + bytes(10))
    line = _error_line(capsys, ["train", "--data-dir", str(tmp_path)])
    assert "corrupt IDX file" in line and "idx3-ubyte" in line


def test_a_config_file_value_is_named_by_its_key(capsys, tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("checkpoint_every = -1\n")
    line = _error_line(capsys, ["train", "--config", str(config)])
    assert line == "tether: error: checkpoint_every must be >= 0, got -1"


def test_unparsable_config_file(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("workers = [\n")
    assert "is not valid TOML" in _error_line(capsys, ["train", "--config", str(bad)])


def test_console_entry_prints_no_traceback() -> None:
    result = run_cli("train", "--workers", "0", timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "tether: error: --workers must be >= 1, got 0"
    assert "Traceback" not in result.stderr


def test_list_shows_registries(capsys) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("sync-sgd", "lenet5", "mlp", "cnn", "resnet8", "fashion-mnist", "cifar10"):
        assert name in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--workers", "abc"], "argument --workers: invalid int value: 'abc'"),
        (["trian"], "invalid choice: 'trian'"),
    ],
)
def test_usage_errors_are_one_line(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_reader_that_goes_away_gets_no_traceback() -> None:
    # `tether list | head -2` printed a BrokenPipeError traceback
    import subprocess
    import sys

    list_ = subprocess.Popen(
        [sys.executable, "-m", "tether", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert list_.stdout is not None and list_.stderr is not None
    list_.stdout.close()  # gone before it writes (it starts in about a second)
    assert list_.wait(timeout=60) == 1
    assert list_.stderr.read() == b""


def test_compares_help_lists_no_option_it_refuses(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    listed = capsys.readouterr().out
    assert "--methods A,B,..." in listed and "--method METHOD" not in listed
