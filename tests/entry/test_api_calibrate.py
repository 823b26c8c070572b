"""``tether.calibrate`` from Python: the user's model, data and loss into a profile and a workload
that ``tether.predict`` and ``tether predict --profile`` use; one-line errors before any timing;
its timed runs are real ``tether.fit`` runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import tether
from tether.api import calibrate as api_calibrate
from tether.bench import calibrate as bench_calibrate
from tether.bench import server_wire
from tether.bench.compute_samples import LoopTimes
from tether.bench.link_fit import fit_ring
from tether.errors import TetherError
from tether.perf.profile import load_profile


def small_net() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))


def small_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 12, generator=generator)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long())


def _stand_ins(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The links, the wire and the timed runs replaced by fixed numbers; the order they ran."""
    order: list[str] = []

    def links(workers, threads, timeout_s):
        order.append("links")
        points = [(4096.0, 2e-3), (1048576.0, 4e-3)]
        return bench_calibrate.LinkFit(*fit_ring(points, workers), 2e-10, workers, points, "now")

    def wire(timeout_s):
        order.append("wire")
        return server_wire.WireFit(1e-4, 1e-9, [(4096.0, 1e-3), (8192.0, 2e-3)], "now")

    def run(self, method, workers, settings):
        order.append(f"{method} x{workers}")
        step = {"sync-sgd": 0.004, "local-sgd": 0.003, "async-sgd": 0.006}[method]
        return LoopTimes(step + 0.001 * workers, step)

    monkeypatch.setattr(bench_calibrate, "measure_links", links)
    monkeypatch.setattr(bench_calibrate, "measure_server_wire", wire)
    monkeypatch.setattr(bench_calibrate, "usable_cores", lambda: [0, 1])
    monkeypatch.setattr(api_calibrate.FitLoops, "_run", run)
    return order


def test_calibrate_from_python_gives_a_profile_that_predicts_the_users_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    order = _stand_ins(monkeypatch)
    out = tmp_path / "cal" / "profile.json"
    cal = tether.calibrate(
        small_net, small_data(), F.cross_entropy, batch_size=32, loop_runs=2, repeats=2,
        name="here", out=out,
    )  # fmt: skip
    # two rounds: the model and its loop on 1 and 2 quiet workers, the links, the exchange
    # (fused, per tensor, served), the wire after the first round only
    round_ = ["sync-sgd x1", "local-sgd x1", "local-sgd x2", "links"]
    exchange = ["sync-sgd x2", "sync-sgd x2", "async-sgd x2"]
    assert order == [*round_, *exchange, "wire", *round_, *exchange]
    assert cal.path == out and cal.profile.name == "here"
    assert [layer.name for layer in cal.workload.layers] == ["0", "2", "(other)"]
    assert cal.workload.batch_size == 32 and cal.workload.measured_on == "here"
    alpha, beta = fit_ring([(4096.0, 2e-3), (1048576.0, 4e-3)], 2)
    assert cal.profile.intra.alpha.value == pytest.approx(alpha)
    assert cal.profile.intra.beta.value == pytest.approx(beta)
    assert cal.profile.exchange_load is not None
    # the file is the command line's: tether predict --profile reads it
    assert load_profile(str(out)).to_dict() == cal.profile.to_dict()
    prediction = tether.predict(cal.workload, "sync-easgd", workers=2, profile=cal.profile)
    assert prediction.iteration_s > 0
    assert "wrote" in capsys.readouterr().err
    # a module (not a factory) is timed on a copy: the caller's weights stay as they were
    net = small_net()
    before = [p.detach().clone() for p in net.parameters()]
    # and the loss by name, as tether.fit takes it (it was called as a function: a TypeError)
    tether.calibrate(net, small_data(), "cross-entropy", loop_runs=1, repeats=2, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"workers": 1}, "workers must be at least 2, got 1"),
        ({"loop_runs": 0}, "loop_runs must be at least 1, got 0"),
        ({"loop_steps": 0}, "loop_steps must be at least 1, got 0"),
        ({"timeout": 0}, "timeout must be a positive number of seconds"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"method": "async-sgd"}, "calibrate sets method of its timed runs itself"),
        ({"loss": lambda model, batch: model(batch[0]).sum()}, "loss(outputs, targets)"),
        ({"train_data": TensorDataset(torch.zeros(0, 12), torch.zeros(0))}, "train_data is empty"),
        ({"model": "lenet5"}, "tether calibrate --model NAME"),
        ({"overwrite": True}, "calibrate sets overwrite of its timed runs itself"),
        ({"threads_per_worker": 0}, "threads_per_worker must be at least 1, got 0"),
        ({"lr_sheduel": "cosine"}, "lr_sheduel"),
        ({"batch_size": 200}, "is larger than the training set (256 samples)"),
        (
            {"train_data": [{"x": torch.zeros(12), "y": 0}] * 8, "batch_size": 4},
            "a batch of train_data is a dict",
        ),
        ({"model": 3}, "model must be a torch.nn.Module or a function returning one, not int"),
        # the file is written at the end: a path that cannot be was an OSError after minutes
        ({"out": "/proc/nope/p.json"}, "out='/proc/nope/p.json' cannot be written"),
        ({"model_parallel": 2}, "does not cover model parallelism"),  # "must divide the 1 workers"
        ({"loss": "msee"}, "unknown loss 'msee'"),  # a name, as tether.fit takes it
    ],
)
def test_bad_input_is_one_line_before_any_timing(
    monkeypatch: pytest.MonkeyPatch, changes: dict, message: str
) -> None:
    def never(*args, **kwargs):
        raise AssertionError("timing started")

    monkeypatch.setattr(bench_calibrate, "calibrate_machine", never)
    arguments = {"model": small_net, "train_data": small_data(), "loss": F.cross_entropy}
    with pytest.raises(TetherError, match=None) as error:
        tether.calibrate(**{**arguments, **changes})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_fit_loops_time_a_real_fit_run() -> None:
    """One real run through tether.fit (a worker process, the metrics file), timed between its
    steps 3 and 9."""
    arguments = dict(
        model=small_net, train_data=small_data(), loss=F.cross_entropy, optimizer=None,
        batch_size=16, collate_fn=None, threads_per_worker=1, overwrite=True,
    )  # fmt: skip
    times = api_calibrate.FitLoops(arguments, 3, 9).one_worker()
    assert 0 < times.compute_s <= times.step_s < 1.0


@pytest.mark.slow
def test_a_real_calibration_from_python(tmp_path: Path) -> None:
    """Every measurement real, one round (about 40 s on 2 cores): the profile predicts the
    user's model with its timed layers, and the command's predict reads the file."""
    out = tmp_path / "profile.json"
    cal = tether.calibrate(
        small_net, small_data(), F.cross_entropy, batch_size=32, loop_runs=1, loop_steps=20,
        repeats=3, out=out, progress=False,
    )  # fmt: skip
    load = cal.profile.exchange_load
    assert load is not None and load.alpha.value >= 0 and load.server.value >= 0
    assert cal.profile.intra.beta.value > 0 and cal.workload.data_s >= 0
    for method in ("sync-sgd", "sync-easgd", "async-sgd"):
        assert tether.predict(cal.workload, method, workers=2, profile=cal.profile).iteration_s > 0
    assert load_profile(str(out)).name == cal.profile.name
