"""A run directory is never damaged by a mistake, and a bad checkpoint is refused before any
worker starts (in one line, never advising ``weights_only=False``)."""

from __future__ import annotations

import argparse
import os
import pickle
import stat
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from tether.cli import main
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.models import build_model
from tether.observe.files import atomic_write_text
from tether.train_options import add_train_options, config_from_args
from tether.training.run_dir import check_run_dir, prepare_run_dir, validate_checkpoint


def _config(out: Path | str, **values: object) -> TrainConfig:
    return TrainConfig(out=str(out), **values)  # type: ignore[arg-type]


def _fake_run(run: Path) -> dict[str, bytes]:
    """A finished run's files; returns their contents, to check nothing changed."""
    run.mkdir(parents=True)
    files = {"summary.json": b"{}", "model.pt": b"weights", "metrics.jsonl": b"{}\n"}
    (run / "timeline").mkdir()
    files["timeline.json"] = b"[]"
    for name, data in files.items():
        (run / name).write_bytes(data)
    return files


def _unchanged(run: Path, files: dict[str, bytes]) -> bool:
    return all((run / name).read_bytes() == data for name, data in files.items())


def _checkpoint(path: Path, **changes: object) -> Path:
    state: dict[str, object] = {
        "method_name": "sync-sgd",
        "model_name": "lenet5",
        "step": 10,
        "model": {"w": torch.ones(3)},
        "method": {},
        "history": [],
        "elapsed_s": 1.0,
        "eval_s": 0.0,
        "time_to_target_s": None,
    }
    for key, value in changes.items():
        if value is None:
            state.pop(key)
        else:
            state[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


class _Exploit:
    """A pickle that would create a file if it were ever unpickled with weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_an_existing_run_is_refused_and_left_alone(tmp_path: Path) -> None:
    run = tmp_path / "run"
    files = _fake_run(run)
    with pytest.raises(TetherError, match=r"holds a run.*--resume.*--overwrite"):
        prepare_run_dir(_config(run, method="sync-sgd"))
    assert _unchanged(run, files)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(TetherError, match="is not empty"):
        prepare_run_dir(_config(tmp_path / "notes"))


def test_overwrite_replaces_tethers_files_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _fake_run(run)
    (run / "mine.txt").write_text("keep me")
    (run / ".model.pt.abc123.tmp").write_bytes(b"half")  # an interrupted write
    prepare_run_dir(_config(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["mine.txt"]
    with pytest.raises(TetherError, match="exclude each other"):
        prepare_run_dir(_config(run, resume=True), overwrite=True)


@pytest.mark.parametrize(
    ("out", "message"),
    [("", "--out is empty"), (" ", "--out is empty"), ("/proc/tether-run", "cannot write")],
)
def test_unusable_out_is_one_line(out: str, message: str) -> None:
    with pytest.raises(TetherError, match=message):
        check_run_dir(_config(out))


def test_out_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(TetherError, match="is a file"):
        check_run_dir(_config(tmp_path / "file"))
    with pytest.raises(TetherError, match=r"cannot write.*Not a directory"):
        check_run_dir(_config(tmp_path / "file" / "run"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_out_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(TetherError, match="cannot write"):
            check_run_dir(_config(tmp_path / "run"))
    finally:
        tmp_path.chmod(0o700)


def test_resume_without_checkpoint_changes_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    files = _fake_run(run)
    with pytest.raises(TetherError, match=r"holds no checkpoint\.pt.*nothing was changed"):
        prepare_run_dir(_config(run, resume=True))
    assert _unchanged(run, files)  # timeline.json included (it used to be deleted)


def test_resume_cleans_interrupted_writes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _checkpoint(run / "checkpoint.pt")
    (run / ".checkpoint.pt.x1y2.tmp").write_bytes(b"half")
    prepare_run_dir(_config(run, resume=True, method="sync-sgd", model="lenet5"))
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt"]
    # the ranks' own checkpoint shards stay for the resume (the replica methods restore them)
    _checkpoint(run / "checkpoint.pt", method_name="sync-easgd", shards=2)
    for rank in range(2):
        _checkpoint(run / "checkpoint-ranks" / f"rank-{rank}.pt")
    prepare_run_dir(_config(run, resume=True, method="sync-easgd", model="lenet5"))
    assert sorted(p.name for p in (run / "checkpoint-ranks").iterdir()) == [
        "rank-0.pt",
        "rank-1.pt",
    ]


def _bad_checkpoints(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    bad: dict[str, tuple[Path, str]] = {}
    empty = tmp_path / "empty" / "checkpoint.pt"
    empty.parent.mkdir()
    empty.write_bytes(b"")
    bad["empty"] = (empty, "not a readable Tether checkpoint")
    good = _checkpoint(tmp_path / "good" / "checkpoint.pt")
    cut = tmp_path / "cut" / "checkpoint.pt"
    cut.parent.mkdir()
    cut.write_bytes(good.read_bytes()[:200])
    bad["truncated"] = (cut, "not a readable Tether checkpoint")
    noise = tmp_path / "noise" / "checkpoint.pt"
    noise.parent.mkdir()
    noise.write_bytes(os.urandom(4096))
    bad["random bytes"] = (noise, "not a readable Tether checkpoint")
    for name, how in (("pickle", pickle.dump), ("torch.save", torch.save)):
        evil = tmp_path / f"evil-{name}" / "checkpoint.pt"
        evil.parent.mkdir()
        with evil.open("wb") as handle:
            how({"model": _Exploit(tmp_path / "pwned")}, handle)  # type: ignore[operator]
        bad[f"malicious {name}"] = (evil, "not a readable Tether checkpoint")
    cases = {
        "a list": ([1, 2], "holds a list"),
        "no model": (None, "lacks model"),
        "nan weights": ({"w": torch.tensor([1.0, float("nan")])}, "non-finite values in w"),
        "inf weights": ({"w": torch.tensor([float("inf")])}, "non-finite"),
        "step too far": (10**6, "step 1000000, outside 0..100"),
        "negative step": (-1, "outside"),
        "step a float": (1.5, "outside"),
        "other method": ("async-sgd", "written by method 'async-sgd'"),
        "other model": ("cnn", "written by model 'cnn'"),
        "model not tensors": ({"w": "x"}, "not a state dict of tensors"),
        "elapsed inf": (float("inf"), "elapsed_s=inf"),
    }
    keys = {
        "no model": "model",
        "nan weights": "model",
        "inf weights": "model",
        "step too far": "step",
        "negative step": "step",
        "step a float": "step",
        "other method": "method_name",
        "other model": "model_name",
        "model not tensors": "model",
        "elapsed inf": "elapsed_s",
    }
    for case, (value, message) in cases.items():
        path = tmp_path / case.replace(" ", "-") / "checkpoint.pt"
        if case == "a list":
            path.parent.mkdir()
            torch.save(value, path)
        else:
            _checkpoint(path, **{keys[case]: value})
        bad[case] = (path, message)
    return bad


def test_bad_checkpoints_are_refused_in_one_line(tmp_path: Path) -> None:
    config = _config(tmp_path, method="sync-sgd", model="lenet5", steps=100, resume=True)
    for case, (path, message) in _bad_checkpoints(tmp_path).items():
        with pytest.raises(TetherError) as caught:
            validate_checkpoint(path, config)
        text = str(caught.value)
        assert message in text, (case, text)
        assert "weights_only=False" not in text and "\n" not in text, (case, text)
    assert not (tmp_path / "pwned").exists()  # no checkpoint ran code
    validate_checkpoint(_checkpoint(tmp_path / "ok" / "checkpoint.pt"), config)


def test_resume_with_another_global_batch_is_refused_where_it_defines_the_run(
    tmp_path: Path,
) -> None:
    for method in ("sync-sgd", "local-sgd"):
        path = tmp_path / method / "checkpoint.pt"
        _checkpoint(path, method_name=method, workers=2, batch_size=32)
        config = _config(tmp_path, method=method, model="lenet5", workers=3, batch_size=32)
        with pytest.raises(TetherError, match=r"global batch \(64 -> 96\).*--workers 2"):
            validate_checkpoint(path, config)
    path = tmp_path / "easgd" / "checkpoint.pt"
    _checkpoint(path, method_name="sync-easgd", workers=2, batch_size=32)
    easgd = _config(tmp_path, method="sync-easgd", model="lenet5", workers=3, batch_size=32)
    # restarts every worker from the center, saying that the steps count the new batch (its
    # epochs went back from 2.6 to 1.5 without a word)
    with pytest.warns(UserWarning, match=r"another global batch \(2 x 32 -> 3 x 32\)"):
        validate_checkpoint(path, easgd)


def test_files_follow_the_umask(tmp_path: Path) -> None:
    for mask, mode in ((0o022, 0o644), (0o002, 0o664), (0o077, 0o600)):
        old = os.umask(mask)
        try:
            atomic_write_text(tmp_path / f"f{mask}", "x")
        finally:
            os.umask(old)
        assert stat.S_IMODE((tmp_path / f"f{mask}").stat().st_mode) == mode


# -- through the command line: one line, exit 2, before any worker starts -----------------------
# In-process through the CLI's main() (each `python -m tether` start costs seconds; the console
# entry's own exit and traceback handling is checked in tests/entry/test_cli_errors.py).
def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_cli_refuses_an_existing_run_and_a_changed_method(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    files = _fake_run(run)
    code, stderr = _cli(capsys, "train", "--steps", "5", "--out", str(run))
    assert code == 2 and "holds a run" in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert _unchanged(run, files)
    atomic_write_text(run / "config.toml", 'method = "sync-sgd"\nmodel = "lenet5"\n')
    _checkpoint(run / "checkpoint.pt")
    code, stderr = _cli(capsys, "train", "--resume", str(run), "--method", "async-sgd")
    assert code == 2 and "continues a method 'sync-sgd' run" in stderr
    code, stderr = _cli(capsys, "train", "--resume", str(run), "--model", "cnn")
    assert code == 2 and "--model cnn would be another run" in stderr
    (run / "checkpoint.pt").write_bytes(b"\x80\x02garbage")
    code, stderr = _cli(capsys, "train", "--resume", str(run))
    assert code == 2 and "not a readable Tether checkpoint" in stderr
    assert "Traceback" not in stderr and "weights_only=False" not in stderr


def test_cli_refuses_an_out_other_than_the_resumed_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--resume o1 --out o1fork` extended o1 and ignored --out: now one line, exit 2, and
    nothing written in either directory; the run's own directory, however spelled, is fine."""
    run, fork = tmp_path / "o1", tmp_path / "o1fork"
    run.mkdir()
    atomic_write_text(run / "config.toml", TrainConfig(method="sync-sgd", out=str(run)).to_toml())
    code, stderr = _cli(capsys, "train", "--resume", str(run), "--out", str(fork))
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert f"--out {fork} would be another directory: drop --out" in stderr
    assert not fork.exists() and sorted(run.iterdir()) == [run / "config.toml"]
    code, stderr = _cli(capsys, "train", "--resume", str(run), "--set", f'out="{fork}"')
    assert code == 2 and "would be another directory" in stderr
    parser = argparse.ArgumentParser()
    add_train_options(parser)
    same = parser.parse_args(["--resume", str(run), "--out", f"{tmp_path}/./o1/"])
    assert config_from_args(same, str).out == str(run)


def test_worker_entry_without_a_launcher_is_one_line() -> None:
    env_free = {
        k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR") if k in os.environ
    }
    try:
        result = run_cli("--steps", "5", module="tether.run")
    finally:
        os.environ.update(env_free)
    assert result.returncode == 2 and "no launcher started this process" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_cli_refuses_a_checkpoint_of_another_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Weights of another shape are named in one line before any worker starts (they used to
    fail inside every worker, on load_state_dict)."""
    run = tmp_path / "run"
    run.mkdir()
    atomic_write_text(
        run / "config.toml", 'method = "sync-sgd"\nmodel = "mlp"\ndataset = "digits"\n'
    )
    five_classes = build_model("mlp", (1, 8, 8), 5).state_dict()  # digits has 10 classes
    _checkpoint(run / "checkpoint.pt", model_name="mlp", model=five_classes)
    code, stderr = _cli(capsys, "train", "--resume", str(run))
    assert code == 2, stderr
    assert (
        "holds another model's weights (layers.5.weight is (5, 128) there and (10, 128) in "
        "this run's model; 1 more difference)" in stderr
    )
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
