"""``tether calibrate | predict | simulate`` end to end: what they write, that a calibrated profile
predicts with its own timed layers, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.cli import main


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tether: error: "), err
    return err[0]


def _png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_predict_on_a_built_in_profile_with_the_scaling_curve(capsys, tmp_path: Path) -> None:
    out = tmp_path / "p"
    argv = ["predict", "--profile", "k80-8gpu-pcie", "--method", "sync-sgd,original-easgd"]
    argv += ["--workers", "1,8", "--scaling", "weak", "--max-workers", "64", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "(counted FLOPs)" in printed and "best --bucket-mb" in printed
    result = json.loads((out / "predict.json").read_text())
    rows = {(r["method"], r["workers"]): r for r in result["predictions"]}
    assert set(rows) == {(m, p) for m in ("sync-sgd", "original-easgd") for p in (1, 8)}
    # the round-robin master serialises 8 exchanges: more exposed communication than sync-sgd
    assert rows["original-easgd", 8]["comm_share"] > rows["sync-sgd", 8]["comm_share"]
    curve = result["scaling"]["curves"]["sync-sgd"]
    assert [r["workers"] for r in curve] == [1, 2, 4, 8, 16, 32, 64]
    assert curve[0]["efficiency"] == pytest.approx(1.0)
    _png(out / "breakdown.png")
    _png(out / "scaling.png")


def test_simulate_writes_the_staleness_distribution(capsys, tmp_path: Path) -> None:
    out = tmp_path / "s"
    argv = ["simulate", "--method", "async-sgd", "--workers", "16", "--rounds", "200"]
    argv += ["--step-ms", "10", "--service-ms", "1", "--jitter", "0.2", "--out", str(out)]
    assert main(argv) == 0
    assert "steps/s" in capsys.readouterr().out
    result = json.loads((out / "simulate.json").read_text())
    assert result["updates"] == 16 * 200
    assert result["server_utilisation"] > 0.5  # 16 workers of 10 ms against a 1 ms server
    _png(out / "staleness.png")


def test_calibrate_then_predict_with_the_timed_layers(capsys, tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    argv = ["calibrate", "--model", "mlp", "--dataset", "digits", "--batch-size", "32"]
    argv += ["--repeats", "5", "--loop-steps", "10", "--loop-runs", "2"]
    assert main([*argv, "--out", str(profile)]) == 0
    data = json.loads(profile.read_text())
    # two samples of the model's step and of the training loop, spread over the calibration
    assert len(data["model_step_s"]) == 2 and len(data["training_loop_step_s"]) == 2
    assert all(seconds > 0 for seconds in data["training_loop_step_s"])
    hardware = data["hardware"]
    assert hardware["intra"]["alpha"]["value"] > 0 and hardware["intra"]["beta"]["value"] > 0
    assert "native all-reduce" in hardware["intra"]["alpha"]["source"]
    assert hardware["flops"]["value"] > 0
    assert data["workload"]["model"] == "mlp" and data["workload"]["batch_size"] == 32
    assert data["workload"]["data_s"] >= 0  # the training loop's own cost, timed
    assert len(data["all_reduce_points"]) == 6  # native all-reduce at 4 KiB .. 16 MiB
    wire = hardware["server_wire"]  # the parameter server's socket wire, timed on 2 ranks
    assert wire["alpha"]["value"] > 0 and "socket-wire round trips" in wire["alpha"]["source"]
    trips = data["server_wire_round_trips"]
    assert len(trips) == 5 and all(seconds > 0 for _, seconds in trips)
    capsys.readouterr()
    argv = ["predict", "--profile", str(profile), "--model", "mlp", "--dataset", "digits"]
    argv += ["--batch-size", "64", "--workers", "1,2", "--out", str(tmp_path / "p")]
    assert main(argv) == 0
    assert "(timed layers)" in capsys.readouterr().out
    result = json.loads((tmp_path / "p" / "predict.json").read_text())
    assert result["workload"]["batch_size"] == 64  # the timed batch of 32, scaled


def test_bad_input_is_one_line(capsys, tmp_path: Path) -> None:
    assert "unknown profile 'moon'" in _error_line(capsys, ["predict", "--profile", "moon"])
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"hardware": {"name": "x"}}))
    line = _error_line(capsys, ["predict", "--profile", str(broken)])
    assert "missing field 'ranks_per_node'" in line
    line = _error_line(capsys, ["predict", "--method", "sync-magic", "--workers", "2"])
    assert "no prediction for method 'sync-magic'" in line
    line = _error_line(capsys, ["simulate", "--method", "sync-sgd"])
    assert "sync-sgd" in line and "async-sgd" in line
    line = _error_line(capsys, ["simulate", "--workers", "0"])
    assert "workers" in line
    for option, value in (
        ("--loop-steps", "0"),
        ("--loop-runs", "0"),
        ("--repeats", "0"),
        ("--workers", "1"),
    ):
        line = _error_line(capsys, ["calibrate", option, value])  # before any timing
        assert f"{option} must be at least" in line, line
    line = _error_line(capsys, ["calibrate", "--timeout", "nan"])
    assert "--timeout must be a positive number" in line
    assert "batch_size must be >= 1" in _error_line(capsys, ["calibrate", "--batch-size", "0"])
    with pytest.raises(SystemExit) as exit_info:  # argparse's own usage error
        main(["predict", "--workers", "0,2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected counts >= 1" in err[0]
