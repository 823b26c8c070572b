"""``tether calibrate | predict | simulate`` end to end: what they write, that a calibrated profile
predicts with its own timed layers, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tether
from tether.bench.link_fit import fit_ring
from tether.cli import main
from tether.errors import TetherError
from tether.launch.partition import usable_cores
from tether.perf.predict import Setup, predict
from tether.perf.profile import load_profile
from tether.perf.workload import Workload


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
    # original-easgd holds its global batch at 128: on 8 workers tether train would run 16, and
    # a prediction at 64 says so, for the weak-scaling curve's counts too (sync-sgd holds
    # nothing, and 1 and 2 workers keep 64)
    note = [line for line in printed.splitlines() if line.startswith("note:")]
    assert note == [
        "note: these predictions are at batch 64 per worker; tether train's defaults would run "
        "original-easgd: 32 on 4, 16 on 8 to 64 workers (the method holds its global batch): "
        "--batch-size N predicts another batch"
    ]
    argv[argv.index("--out") + 1] = str(tmp_path / "q")
    assert main([*argv, "--batch-size", "16"]) == 0
    assert "note:" not in capsys.readouterr().out  # a batch the user gave is what they asked
    # predicted again into the same directory without a curve: the old curves go (they were
    # left beside the new numbers)
    assert main([*argv[: argv.index("--scaling")], "--out", str(out)]) == 0
    assert "scaling" not in json.loads((out / "predict.json").read_text())
    assert not (out / "scaling.png").exists()


def test_simulate_writes_the_staleness_distribution(capsys, tmp_path: Path) -> None:
    out = tmp_path / "s"
    argv = ["simulate", "--method", "async-sgd", "--workers", "16", "--rounds", "200"]
    argv += ["--step-ms", "10", "--service-ms", "1", "--jitter", "0.2", "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr()
    assert "async-sgd: 16 workers x 200 rounds in " in said.out and "steps/s" in said.out
    # both files where they are (the plot was named without its directory)
    assert f"wrote {out / 'simulate.json'} and {out / 'staleness.png'}" in said.err
    result = json.loads((out / "simulate.json").read_text())
    assert result["updates"] == 16 * 200
    assert result["server_utilisation"] > 0.5  # 16 workers of 10 ms against a 1 ms server
    _png(out / "staleness.png")
    # what is left out is the same in Python (its messages and service were free before)
    assert (
        main(["simulate", "--method", "original-easgd", "--workers", "8", "--out", str(out)]) == 0
    )
    by_default = json.loads((out / "simulate.json").read_text())
    same = tether.simulate("original-easgd", 8).to_dict()
    assert same["throughput_steps_s"] == by_default["throughput_steps_s"]
    assert same["server_utilisation"] == by_default["server_utilisation"] > 0


@pytest.mark.slow  # 35-50 s on 2 cores: every measurement of a calibration, for real
def test_calibrate_then_predict_with_the_timed_layers(capsys, tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    argv = ["calibrate", "--model", "mlp", "--dataset", "digits", "--batch-size", "32"]
    argv += ["--repeats", "5", "--loop-steps", "10", "--loop-runs", "1"]
    assert main([*argv, "--out", str(profile)]) == 0
    data = json.loads(profile.read_text())
    # one sample of the model's step, and of the training loop on one worker and on every core
    # (how the samples are spread over a calibration: the test below)
    assert len(data["model_step_s"]) == 1 and len(data["training_loop_step_s"]) == 1
    assert all(seconds > 0 for seconds in data["training_loop_step_s"])
    if len(usable_cores()) > 1:
        assert len(data["busy_node_compute_s"]) == 1 and data["busy_node_compute_s"][0] > 0
        slowdown = data["hardware"]["busy_node_slowdown"]
        assert slowdown["value"] >= 1 and "every core busy" in slowdown["source"]
    hardware = data["hardware"]
    assert hardware["intra"]["alpha"]["value"] > 0 and hardware["intra"]["beta"]["value"] > 0
    assert "native all-reduce" in hardware["intra"]["alpha"]["source"]
    assert hardware["flops"]["value"] > 0
    assert data["workload"]["model"] == "mlp" and data["workload"]["batch_size"] == 32
    assert data["workload"]["data_s"] >= 0  # the training loop's own cost, timed
    assert len(data["all_reduce_points"]) == 6  # native all-reduce at 4 KiB .. 16 MiB
    assert data["all_reduce_points_per_measurement"] == [data["all_reduce_points"]]
    wire = hardware["server_wire"]  # the parameter server's socket wire, timed on 2 ranks
    assert wire["alpha"]["value"] > 0 and "socket-wire round trips" in wire["alpha"]["source"]
    trips = data["server_wire_round_trips"]
    assert len(trips) == 5 and all(seconds > 0 for _, seconds in trips)
    # the exchange in training: two sync-sgd runs on 2 workers, and the load fitted to them
    assert all(
        len(data[k]) == 1 and data[k][0] > 0
        for k in ("exchange_fused_step_s", "exchange_per_tensor_step_s", "exchange_served_step_s")
    )
    load = hardware["exchange_load"]
    assert load["alpha"]["value"] >= 0 and load["skew"]["value"] >= 0
    assert "sync-sgd without overlap on 2 workers" in load["skew"]["source"]
    assert load["server"]["value"] >= 0 and "async-sgd on 2 workers" in load["server"]["source"]
    assert "an exchange in training costs" in capsys.readouterr().out
    argv = ["predict", "--profile", str(profile), "--model", "mlp", "--dataset", "digits"]
    argv += ["--batch-size", "64", "--workers", "1,2", "--out", str(tmp_path / "p")]
    assert main(argv) == 0
    assert "(timed layers)" in capsys.readouterr().out
    result = json.loads((tmp_path / "p" / "predict.json").read_text())
    assert result["workload"]["batch_size"] == 64  # the timed batch of 32, scaled


def test_calibrate_spreads_its_compute_samples_over_the_calibration(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The model's step, the training loop and the busy-node pair are sampled three times, each
    time followed by a measurement of the links (the wire once, after the first) and of the
    exchange in training; the medians are kept: for the links, the ring fitted to each size's
    median time. The measurements are stand-ins here (the test above runs the real ones)."""
    from tether import perf_workloads
    from tether.bench import calibrate, compute_samples, server_wire

    order: list[str] = []
    timed = perf_workloads.timed_workload
    # (sync-sgd on 1 worker, the pair: 1 and 2 workers that never communicate) x 3: the compute
    # per step; the whole loop 1 ms more
    computes = iter([0.010, 0.002, 0.005, 0.012, 0.004, 0.0044, 0.014, 0.006, 0.0066])

    def layers(*args):
        order.append("layers")
        return timed(*args)

    def loop(name):
        order.append(name)
        compute = next(computes)
        return compute_samples.LoopTimes(compute + 0.001, compute)

    # three measurements of the links: (4 KiB, 1 MiB) times and gamma; medians 2e-3, 4e-3, 2e-10
    link_times = iter([(1e-3, 4e-3, 3e-10), (3e-3, 2e-3, 1e-10), (2e-3, 9e-3, 2e-10)])

    def links(workers, threads, timeout_s):
        order.append("links")
        small, large, gamma = next(link_times)
        points = [(4096.0, small), (1048576.0, large)]
        return calibrate.LinkFit(*fit_ring(points, workers), gamma, workers, points, "now")

    def wire(timeout_s):
        order.append("wire")
        return server_wire.WireFit(1e-4, 1e-9, [(4096.0, 1e-3), (8192.0, 2e-3)], "now")

    monkeypatch.setattr(perf_workloads, "timed_workload", layers)
    loops = compute_samples.TrainerLoops
    monkeypatch.setattr(loops, "one_worker", lambda self: loop("loop"))
    monkeypatch.setattr(loops, "quiet", lambda self, n: loop({1: "alone", 2: "busy"}[n]))
    # sync-sgd on 2 workers without overlap: fused, then a message per tensor (medians 30, 60 ms)
    exchange_times = iter([0.030, 0.060, 0.020, 0.070, 0.040, 0.050])

    def exchanging(self, workers, bucket_mb):
        order.append(f"exchange {bucket_mb:g}")
        step = next(exchange_times)
        return compute_samples.LoopTimes(step, step / 2)

    monkeypatch.setattr(loops, "exchanging", exchanging)
    # async-sgd on 2 workers (median 40 ms)
    served_times = iter([0.050, 0.040, 0.030])

    def serving(self, workers):
        order.append("served")
        step = next(served_times)
        return compute_samples.LoopTimes(step, step / 2)

    monkeypatch.setattr(loops, "serving", serving)
    monkeypatch.setattr(calibrate, "measure_links", links)
    monkeypatch.setattr(calibrate, "measure_server_wire", wire)
    monkeypatch.setattr(calibrate, "usable_cores", lambda: [0, 1])
    out = tmp_path / "profile.json"
    argv = ["calibrate", "--model", "mlp", "--dataset", "digits", "--repeats", "1"]
    assert main([*argv, "--loop-runs", "3", "--out", str(out)]) == 0
    sample = ["layers", "loop", "alone", "busy"]
    exchange = ["exchange 25", "exchange 0", "served"]
    assert order == [
        *[*sample, "links", *exchange, "wire"],
        *[*sample, "links", *exchange],
        *[*sample, "links", *exchange],
    ]
    data = json.loads(out.read_text())
    alpha, beta = fit_ring([(4096.0, 2e-3), (1048576.0, 4e-3)], 2)
    assert data["hardware"]["intra"]["alpha"]["value"] == pytest.approx(alpha)
    assert data["hardware"]["intra"]["beta"]["value"] == pytest.approx(beta)
    assert data["hardware"]["gamma"]["value"] == pytest.approx(2e-10)
    assert "median of 3 measurements" in data["hardware"]["intra"]["alpha"]["source"]
    assert data["all_reduce_points"] == [[4096.0, 2e-3], [1048576.0, 4e-3]]
    assert [m[1][1] for m in data["all_reduce_points_per_measurement"]] == [4e-3, 2e-3, 9e-3]
    assert data["training_loop_step_s"] == pytest.approx([0.011, 0.013, 0.015])
    assert data["one_worker_compute_s"] == [0.002, 0.004, 0.006]
    assert data["busy_node_compute_s"] == [0.005, 0.0044, 0.0066]
    # the median pair ratio (2.5, 1.1, 1.1), not the ratio of the medians (0.005 / 0.004)
    assert data["hardware"]["busy_node_slowdown"]["value"] == pytest.approx(1.1)
    assert "a busy node slows a worker 1.10x (2 workers)" in capsys.readouterr().out
    # the exchange under load makes the profile predict both exchange runs' medians
    assert data["exchange_fused_step_s"] == [0.030, 0.020, 0.040]
    profile, workload = load_profile(str(out)), Workload.from_dict(data["workload"])
    for bucket_mb, median in ((25.0, 0.030), (0.0, 0.060)):
        setup = Setup("sync-sgd", 2, bucket_mb=bucket_mb, overlap=False)
        assert predict(workload, profile, setup).iteration_s == pytest.approx(median)
    served = predict(workload, profile, Setup("async-sgd", 2)).iteration_s
    assert served == pytest.approx(0.040)


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
    assert "--batch-size must be >= 1" in _error_line(capsys, ["calibrate", "--batch-size", "0"])
    with pytest.raises(SystemExit) as exit_info:  # argparse's own usage error
        main(["predict", "--workers", "0,2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected counts >= 1" in err[0]


def _never(*args, **kwargs):
    raise AssertionError("the model was built or timed before the refusal")


@pytest.fixture
def no_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal must come before any timing: timing fails the test."""
    from tether import perf_workloads
    from tether.bench import calibrate

    monkeypatch.setattr(perf_workloads, "timed_workload", _never)
    monkeypatch.setattr(calibrate, "calibrate_machine", _never)


@pytest.fixture
def user_sets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's module (module:factory, module:loader) on the working directory: a small net,
    an empty data set and one of 10 samples."""
    (tmp_path / "perf_cli_sets.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "from torch.utils.data import TensorDataset\n"
        "def build():\n    return nn.Sequential(nn.Flatten(), nn.Linear(20, 3))\n"
        "def load_empty():\n"
        "    return TensorDataset(torch.zeros(0, 20), torch.zeros(0, dtype=torch.long)), None\n"
        "def load_ten():\n"
        "    return TensorDataset(torch.randn(10, 20), torch.randint(0, 3, (10,))), None\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_out_that_cannot_be_written_is_refused_before_any_work(
    capsys, tmp_path: Path, no_timing: None
) -> None:
    """calibrate measured for minutes and then died on an IsADirectoryError; simulate and
    predict gave FileExistsError or NotADirectoryError tracebacks."""
    a_file = tmp_path / "afile"
    a_file.write_text("")
    calibrate = ["calibrate", "--model", "mlp", "--dataset", "digits", "--out"]
    line = _error_line(capsys, [*calibrate, str(tmp_path)])
    assert f"--out {tmp_path} is a directory" in line and "profile.json" in line
    line = _error_line(capsys, [*calibrate, str(a_file / "sub" / "profile.json")])
    assert f"{a_file} is a file, not a directory" in line
    # where nothing can be made, even as root (a traceback after the whole calibration)
    line = _error_line(capsys, [*calibrate, "/proc/nope/profile.json"])
    assert "--out /proc/nope/profile.json cannot be written: nothing can be made in /proc" in line
    for command in ("simulate", "predict"):
        line = _error_line(capsys, [command, "--out", str(a_file)])
        assert f"--out {a_file} is a file, not a directory" in line
        line = _error_line(capsys, [command, "--out", str(a_file / "sub")])
        assert f"--out {a_file / 'sub'} cannot be made: {a_file} is a file" in line
    assert not (tmp_path / "runs").exists()


def test_predict_refuses_what_no_run_takes_before_building_the_model(
    capsys, tmp_path: Path, no_timing: None
) -> None:
    """Each of these was refused only after the model was built and timed, or predicted as if
    it made sense (0 threads: a worker using no core), or (--method ,) predicted nothing."""
    argv = ["predict", "--model", "mlp", "--dataset", "digits", "--out", str(tmp_path / "p")]
    for option, value, message in (
        ("--threads-per-worker", "0", "--threads-per-worker must be >= 1, got 0"),
        ("--bucket-mb", "-1", "--bucket-mb must be >= 0 and finite"),
        ("--bucket-mb", "nan", "--bucket-mb must be >= 0 and finite"),
        ("--bucket-mb", "inf", "--bucket-mb must be >= 0 and finite (MiB; 0: one message per"),
        ("--tau", "0", "--tau must be >= 1, got 0"),
        ("--allreduce", "bogus", "unknown all-reduce 'bogus': one of native, auto"),
        ("--ranks-per-node", "-1", "--ranks-per-node must be >= 0 (0: the profile's), got -1"),
        ("--method", ",", "--method names no method: give one or more of sync-sgd"),
    ):
        assert message in _error_line(capsys, [*argv, option, value]), (option, value)


def test_simulate_names_its_options_in_their_units(capsys, tmp_path: Path) -> None:
    argv = ["simulate", "--out", str(tmp_path / "s")]
    line = _error_line(capsys, [*argv, "--message-ms", "-1"])
    assert "--message-ms must be a finite number >= 0 (milliseconds), got -1.0" in line
    line = _error_line(capsys, [*argv, "--step-ms", "0"])
    assert "--step-ms must be a finite number > 0 (milliseconds)" in line
    line = _error_line(capsys, [*argv, "--straggler-probability", "nan"])
    assert "--straggler-probability must be a probability in [0, 1]" in line
    assert not (tmp_path / "s").exists()


def test_a_data_set_no_calibration_can_use_is_one_line(
    capsys, user_sets: Path, no_timing: None
) -> None:
    """An empty data set was a StopIteration traceback (the Python API's line now); one smaller
    than the calibration's global batch failed after 20 s of timing, pointing at a log in a
    directory already deleted."""
    model = ["--model", "perf_cli_sets:build", "--out", str(user_sets / "p.json")]
    empty = ["--dataset", "perf_cli_sets:load_empty"]
    line = _error_line(capsys, ["calibrate", *model, *empty])
    assert line == "tether: error: train_data is empty: there is no batch to time"
    line = _error_line(capsys, ["calibrate", *model, "--dataset", "perf_cli_sets:load_ten"])
    # calibrate has no --accumulate: its advice named it
    assert line.endswith(
        "= 128) is larger than the training set (10 samples): lower --batch-size or --workers"
    )


def test_predict_on_an_empty_data_set_is_one_line(capsys, user_sets: Path) -> None:
    argv = ["predict", "--model", "perf_cli_sets:build", "--dataset", "perf_cli_sets:load_empty"]
    line = _error_line(capsys, [*argv, "--out", str(user_sets / "p")])
    assert line == "tether: error: train_data is empty: there is no batch to time"


def _small_workload(model: str) -> dict:
    """A one-layer workload as tether calibrate writes it, timed on vm-2cores."""
    return {
        "model": model, "batch_size": 64, "update_s": 1e-4, "data_s": 0.0,
        "measured_on": "vm-2cores",
        "layers": [{"name": "fc", "tensor_bytes": [4000, 40], "forward_flops": 1e6,
                    "forward_s": 1e-3, "backward_s": 2e-3}],
    }  # fmt: skip


def _profile_file(tmp_path: Path, workload: object) -> Path:
    """A profile file: vm-2cores's hardware and ``workload``."""
    path = tmp_path / "cal.json"
    path.write_text(
        json.dumps({"hardware": load_profile("vm-2cores").to_dict(), "workload": workload})
    )
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda w: w.update(batch_size=0), "'batch_size' must be a whole number >= 1, not 0"),
        (lambda w: w.update(batch_size=-4), "'batch_size' must be a whole number >= 1, not -4"),
        (lambda w: w["layers"][0].update(forward_s=-1.0), "'layers[0].forward_s' must be >= 0"),
        (
            lambda w: w["layers"][0].update(forward_s=float("nan")),
            "'layers[0].forward_s' must be a finite number, not nan",
        ),
        (lambda w: w.update(update_s="fast"), "'update_s' must be a finite number, not 'fast'"),
        (lambda w: w.__delitem__("layers"), "missing field 'layers'"),
        (lambda w: w.update(layers=None), "'layers' must be a list of objects"),
        # it was an AttributeError traceback
        (lambda w: "abc", "expected a JSON object (as tether calibrate writes it), not str"),
    ],
)
def test_a_damaged_workload_in_a_profile_file_is_one_line_naming_the_field(
    capsys, tmp_path: Path, change, message: str
) -> None:
    """The workload was barely checked (the hardware thoroughly): a batch of 0 divided by zero,
    a negative batch or time predicted negative times with exit code 0, a NaN time ended in
    matplotlib's traceback."""
    workload = _small_workload("lenet5")
    path = _profile_file(tmp_path, change(workload) or workload)
    argv = ["predict", "--profile", str(path), "--workers", "1,2", "--out", str(tmp_path / "p")]
    line = _error_line(capsys, argv)
    assert f"workload {path}: " in line and message in line


def test_predict_takes_the_model_its_profile_file_timed(capsys, tmp_path: Path) -> None:
    # Before, `tether predict --profile FILE` without --model predicted lenet5 (the default)
    # from counted FLOPs, not the model `tether calibrate --model M` had timed into FILE.
    path = _profile_file(tmp_path, _small_workload("mlp"))
    argv = ["predict", "--profile", str(path), "--workers", "2", "--out", str(tmp_path / "p")]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("mlp, batch 64 per worker, 3.9 KiB of parameters") and (
        "(timed layers)" in first
    ), first


def test_a_tau_the_method_does_not_take_is_named(capsys, tmp_path: Path) -> None:
    # Before, --tau with sync-sgd (or simulate's hogwild-sgd) changed nothing, without a word.
    argv = ["predict", "--profile", "k80-8gpu-pcie", "--method", "sync-sgd,sync-easgd"]
    assert main([*argv, "--tau", "4", "--workers", "2", "--out", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    assert "--tau has no effect on sync-sgd (each exchanges after every step)" in err
    argv = ["simulate", "--method", "hogwild-sgd", "--tau", "4", "--rounds", "10"]
    assert main([*argv, "--out", str(tmp_path / "s")]) == 0
    assert "--tau has no effect on hogwild-sgd" in capsys.readouterr().err


def test_simulate_pins_slow_workers(capsys, tmp_path: Path) -> None:
    # The docs' "one worker 4x slower" could not be asked for: worker_factors was internal.
    argv = ["simulate", "--method", "original-easgd", "--workers", "8", "--rounds", "100"]
    rates = []
    for slow in ([], ["--slow-workers", "1:4"]):
        assert main([*argv, *slow, "--out", str(tmp_path / f"s{len(slow)}")]) == 0
        rates.append(json.loads((tmp_path / f"s{len(slow)}" / "simulate.json").read_text()))
    ratio = rates[1]["throughput_steps_s"] / rates[0]["throughput_steps_s"]
    assert 0.2 < ratio < 0.35  # every round of the round robin waits for the slow rank
    capsys.readouterr()
    line = _error_line(capsys, [*argv, "--slow-workers", "9:2"])
    assert "--slow-workers 9:2 names more than the 8 workers" in line
    with pytest.raises(TetherError, match="worker_factors has 2 entries for 8 workers"):
        tether.simulate("async-easgd", 8, 10, 0.01, worker_factors=[4, 1])


def test_hogwild_sgd_beyond_a_node_is_refused_before_anything_is_printed(capsys) -> None:
    argv = ["predict", "--profile", "p40-cluster", "--method", "hogwild-sgd", "--workers", "8,64"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # the table never started
    assert (
        "hogwild-sgd shares its weights in one node's memory: at most 8 workers on p40-cluster "
        "(8 ranks per node, --ranks-per-node), got --workers 64; across nodes" in captured.err
    ), captured.err
