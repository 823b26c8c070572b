"""The user's side of the step seam, in one process: losses in both forms, evaluation with the
user's metrics, batches from any dataset, the wrapped optimizer's accumulation, the task's trip
to the workers, the dry run, and names and import paths on the command line."""

from __future__ import annotations

import dataclasses
import pickle
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import Dataset, TensorDataset

from tether.catalog import load_data, task_from_config
from tether.config import TrainConfig
from tether.data.sharding import GlobalBatchSampler, WorkerSampler
from tether.data.user_data import infer_shape_and_classes
from tether.errors import TetherError
from tether.imports import load_object
from tether.methods import MethodContext, StepTimes, TrainingMethod
from tether.metrics import accuracy, mean_absolute_error
from tether.optim import LookaheadNesterov, check_distributable
from tether.optim.schedules import check_schedule
from tether.targets import parse_target
from tether.training.batches import TrainBatches, batch_size_of, eval_batches, to_device
from tether.training.evaluation import Evaluator
from tether.training.method_optimizer import MethodOptimizer
from tether.training.objective import LOSSES, Objective, split_batch
from tether.training.probe import probe_task, unseeded_model
from tether.training.task import Task
from tether.training.task_file import pickle_argument, read_task, uses_main, write_task

CPU = torch.device("cpu")


def _xy(n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)


class Sample(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


class DictData(Dataset):
    """Samples as dicts, the way tokenised text usually comes."""

    def __init__(self) -> None:
        self.x, self.y = _xy()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"features": self.x[i], "label": self.y[i]}


def dict_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["features"]), batch["label"])


def vector_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def test_the_loss_comes_in_two_forms() -> None:
    model = nn.Linear(4, 3)
    x, y = _xy()
    plain = Objective(nn.CrossEntropyLoss())(model, (x, y))
    assert torch.allclose(plain.loss, F.cross_entropy(model(x), y))
    assert plain.outputs is not None and plain.targets is y
    batch = {"features": x, "label": y}
    by_batch = Objective(dict_loss)(model, batch)
    assert torch.allclose(by_batch.loss, plain.loss) and by_batch.outputs is None
    with pytest.raises(TetherError, match=r"scalar tensor, got a tensor of shape \(12,\)"):
        Objective(vector_loss)(model, (x, y))
    with pytest.raises(TetherError, match=r"dict with keys \['features', 'label'\].*loss\(model"):
        split_batch(batch)


def test_regression_losses_match_shapes() -> None:
    outputs, targets = torch.randn(5, 1), torch.randn(5)
    mse = LOSSES.get("mse")(0.0)
    assert torch.allclose(mse(outputs, targets), F.mse_loss(outputs.squeeze(1), targets))
    smoothed = LOSSES.get("cross-entropy")(0.1)
    assert smoothed.label_smoothing == 0.1


def test_evaluation_averages_metrics_over_samples_and_picks_defaults() -> None:
    model = nn.Linear(4, 3)
    x, y = _xy(10)
    batches = [(x[:7], y[:7]), (x[7:], y[7:])]  # unequal batches: weights by sample count
    result = Evaluator(Objective(nn.CrossEntropyLoss()), None).evaluate(model, batches)
    assert set(result) == {"loss", "accuracy"}  # class scores against class indices
    expected = F.cross_entropy(model(x), y).detach()
    assert result["loss"] == pytest.approx(float(expected), rel=1e-6)
    assert result["accuracy"] == pytest.approx(accuracy(model(x), y))
    regression = nn.Linear(4, 1)
    targets = torch.randn(10)
    mse = LOSSES.get("mse")(0.0)
    scored = Evaluator(Objective(mse), {"mae": lambda o, t: float((o.squeeze(1) - t).abs().mean())})
    out = scored.evaluate(regression, [(x, targets)])
    assert set(out) == {"loss", "mae"}
    plain = Evaluator(Objective(mse), None).evaluate(regression, [(x, targets)])
    assert set(plain) == {"loss"}  # no accuracy for a regression


class _Listed(Dataset):
    def __init__(self, data: TensorDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        return self.data[i]


def test_any_dataset_gives_the_same_batches_as_the_tensor_fast_path() -> None:
    x, y = _xy(40)
    tensors = TensorDataset(x, y)
    sampler = GlobalBatchSampler(40, 8, seed=3)
    fast = list(TrainBatches(tensors, sampler, 1, 2, CPU).iterate(2, 7))
    loaded = list(TrainBatches(_Listed(tensors), sampler, 1, 2, CPU).iterate(2, 7))
    forked = list(
        TrainBatches(
            _Listed(tensors), sampler, 1, 2, CPU, loader_options={"num_workers": 1}
        ).iterate(2, 7)
    )  # DataLoader worker processes keep the order
    assert len(fast) == len(loaded) == len(forked) == 5
    for a, b, c in zip(fast, loaded, forked, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[0], c[0])
    shares = [list(eval_batches(tensors, r, 3, 5, CPU)) for r in range(3)]
    assert sum(batch_size_of(b) for share in shares for b in share) == 40
    dicts = next(TrainBatches(DictData(), GlobalBatchSampler(12, 4, 0), 0, 1, CPU).iterate(0, 1))
    assert set(dicts) == {"features", "label"} and dicts["features"].shape == (4, 4)
    assert to_device({"a": [x[:1], (y[:1],)]}, CPU)["a"][1][0].shape == (1,)
    # default_collate keeps a namedtuple, which cannot be rebuilt from one generator (every
    # worker failed on its first batch)
    pair = Sample(x[:2], y[:2])
    moved = to_device(pair, CPU)
    assert isinstance(moved, Sample) and torch.equal(moved.y, y[:2])


def test_a_workers_sampler_is_its_slice_of_each_global_batch() -> None:
    union = []
    for worker in range(2):
        sampler = WorkerSampler(40, batch_size=4, worker=worker, workers=2, seed=5)
        sampler.set_epoch(1)
        union.append(list(sampler))
        assert len(sampler) == len(union[-1]) == 20
    reference = GlobalBatchSampler(40, 8, seed=5)
    for step in range(5):
        together = union[0][4 * step : 4 * step + 4] + union[1][4 * step : 4 * step + 4]
        assert together == reference.global_indices(5 + step).tolist()  # epoch 1 = steps 5..9


class _Counting(TrainingMethod):
    """Counts the method's calls; its step is the plain local update."""

    name = "counting"

    def __init__(self, model: nn.Module, config: TrainConfig | None = None) -> None:
        transport = SimpleNamespace(rank=0, world_size=1)
        context = MethodContext(config or TrainConfig(), transport, CPU)  # type: ignore[arg-type]
        super().__init__(model, context, torch.optim.SGD(model.parameters(), lr=1.0))
        self.calls: list[str] = []

    def zero_grad(self) -> None:
        self.calls.append("zero")
        super().zero_grad()

    def set_gradient_sync(self, enabled: bool) -> None:
        self.calls.append(f"sync={enabled}")

    def step(self, backward: Any, times: StepTimes) -> Any:
        self.calls.append("step")
        return self.local_update(backward, times)


def test_accumulation_steps_once_on_the_mean_gradient() -> None:
    model = nn.Linear(1, 1, bias=False)
    model.weight.data.fill_(0.0)
    method = _Counting(model)
    optimizer = MethodOptimizer(method, accumulate=2)
    for value in (1.0, 3.0):  # loss = w * value: the gradients are 1 and 3
        optimizer.zero_grad()
        (model(torch.tensor([[value]])).sum()).backward()
        optimizer.step()
    assert model.weight.item() == pytest.approx(-2.0)  # lr 1 times the mean gradient
    # Gradients cleared once, communication only on the pass that ends the accumulation.
    assert method.calls == ["sync=False", "zero", "sync=True", "step", "sync=False"]
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    optimizer.step()
    optimizer.step()
    scheduler.step()
    assert method.optimizer.param_groups[0]["lr"] == 0.5  # a scheduler drives the wrapped one


def test_an_fp16_loops_optimizer_state_holds_its_loss_scale() -> None:
    # saved and loaded with opt.state_dict(), a loop resumed from the initial 65536 and skipped
    # steps to find its scale again
    model = nn.Linear(2, 1)
    method = _Counting(model, TrainConfig(precision="fp16"))
    assert method.scaler is not None
    method.scaler.scale, method.scaler.skipped = 1024.0, 7
    saved = MethodOptimizer(method).state_dict()
    again = _Counting(nn.Linear(2, 1), TrainConfig(precision="fp16"))
    MethodOptimizer(again).load_state_dict(saved)
    assert again.scaler is not None and (again.scaler.scale, again.scaler.skipped) == (1024.0, 7)
    plain = MethodOptimizer(_Counting(nn.Linear(2, 1))).state_dict()
    assert set(plain) == {"state", "param_groups"}  # fp32: the optimizer's alone


def test_a_closure_that_clears_the_gradients_keeps_the_accumulated_ones() -> None:
    model = nn.Linear(1, 1, bias=False)
    model.weight.data.fill_(0.0)
    optimizer = MethodOptimizer(_Counting(model), accumulate=2)
    for value in (1.0, 3.0):

        def closure(v: float = value) -> torch.Tensor:
            optimizer.zero_grad()  # as torch closures do
            loss = model(torch.tensor([[v]])).sum()
            loss.backward()
            return loss

        optimizer.step(closure)
    assert model.weight.item() == pytest.approx(-2.0)  # the mean of both gradients


def test_optimizers_and_schedules_a_method_cannot_follow_are_refused() -> None:
    model = nn.Linear(2, 1)
    lookahead = _Counting(model)
    lookahead.optimizer = LookaheadNesterov(model.parameters(), lr=0.1)
    with pytest.raises(TetherError, match="cannot accumulate"):
        MethodOptimizer(lookahead, accumulate=2)
    with pytest.raises(TetherError, match=r"optimizer.step\(closure\)"):
        MethodOptimizer(lookahead).step()
    with pytest.raises(TetherError, match="LBFGS calls its closure"):
        check_distributable(torch.optim.LBFGS(model.parameters()))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TetherError, match="ReduceLROnPlateau steps on a metric"):
        check_schedule(torch.optim.lr_scheduler.ReduceLROnPlateau(sgd))
    chained = torch.optim.lr_scheduler.ChainedScheduler([torch.optim.lr_scheduler.ConstantLR(sgd)])
    with pytest.raises(TetherError, match="ChainedScheduler has none"):
        check_schedule(chained)


def test_an_asynchronous_schedule_moves_to_the_global_step_and_never_back() -> None:
    method = _Counting(nn.Linear(1, 1))
    method.scheduler = torch.optim.lr_scheduler.LambdaLR(method.optimizer, lambda s: 0.5**s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # moving before the first local step is meant: no warning
        method.advance_schedule(3)
    assert method.scheduler.last_epoch == 3 and method.optimizer.param_groups[0]["lr"] == 0.125
    method.advance_schedule(2)  # a late reply with an older global step changes nothing
    assert method.scheduler.last_epoch == 3


def test_a_resume_moves_the_schedule_however_far(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's report moves a worker's schedule only so far at once (a hostile one could
    make it step forever); the run's own checkpoint step is not such a report."""
    monkeypatch.setattr("tether.methods.base.MAX_SCHEDULE_ADVANCE", 5)
    method = _Counting(nn.Linear(1, 1))
    method.scheduler = torch.optim.lr_scheduler.LambdaLR(method.optimizer, lambda s: 0.5**s)
    with pytest.raises(TetherError, match="reported global step 9"):
        method.advance_schedule(9)
    method.advance_schedule(9, resumed=True)
    assert method.scheduler.last_epoch == 9


def build_linear() -> nn.Module:
    return nn.Linear(4, 3)


def _in_main() -> int:
    return 1


def test_objects_of_the_callers_script_are_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_in_main, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "_in_main", _in_main, raising=False)
    assert uses_main(pickle.dumps(_in_main))


def test_a_script_read_from_stdin_is_an_interactive_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `python - < script.py`: its __main__ has a file name, "<stdin>", that no worker can
    # import; the workers started and failed on FileNotFoundError
    monkeypatch.setattr(_in_main, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "_in_main", _in_main, raising=False)
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    monkeypatch.setattr(sys.modules["__main__"], "__file__", "<stdin>", raising=False)
    with pytest.raises(TetherError, match=r"^model is defined in an interactive session"):
        pickle_argument("model", _in_main)


def test_a_failing_model_factory_is_one_line() -> None:
    # it was the factory's own traceback (tether.fit(model=torch.nn.Linear): a class that
    # needs arguments), before any check of the task
    x, y = _xy()
    task = Task(model=nn.Linear, train_data=TensorDataset(x, y), loss=nn.CrossEntropyLoss())
    with pytest.raises(TetherError, match=r"^building the model \(Linear\) failed: TypeError"):
        unseeded_model(task)


def test_the_task_makes_the_trip_and_errors_name_the_argument(tmp_path: Path) -> None:
    x, y = _xy()
    task = Task(model=build_linear, train_data=TensorDataset(x, y), loss=nn.CrossEntropyLoss())
    write_task(task, tmp_path / "task")
    assert (tmp_path / "task").stat().st_mode & 0o077 == 0  # only the user can read it
    back = read_task(tmp_path / "task")
    assert isinstance(back.build_model(), nn.Linear)
    assert torch.equal(back.train_data.tensors[0], x)  # type: ignore[attr-defined]
    with pytest.raises(TetherError, match=r"^model cannot be sent .*top level"):
        write_task(
            Task(model=lambda: nn.Linear(4, 3), train_data=task.train_data, loss=task.loss),
            tmp_path / "t",
        )
    with pytest.raises(TetherError, match=r"^loss cannot be sent"):
        pickle_argument("loss", lambda o, t: o.sum())
    unsendable = {"worker_init_fn": lambda i: None}  # named: it was "the task"
    with pytest.raises(TetherError, match=r"^loader_options cannot be sent"):
        write_task(Task(build_linear, task.train_data, task.loss, loader_options=unsendable),
                   tmp_path / "u")  # fmt: skip
    assert not uses_main(pickle.dumps(task.model))


def test_the_dry_run_catches_bad_components_in_one_line() -> None:
    x, y = _xy()
    data = TensorDataset(x, y)
    probe_task(Task(model=build_linear, train_data=data, loss=nn.CrossEntropyLoss()))
    with pytest.raises(TetherError, match="must return a scalar tensor"):
        probe_task(Task(model=build_linear, train_data=data, loss=vector_loss))
    with pytest.raises(TetherError, match=r"model and loss failed .*mat1 and mat2"):
        probe_task(Task(model=lambda: nn.Linear(5, 3), train_data=data, loss=nn.CrossEntropyLoss()))
    with pytest.raises(TetherError, match="metric 'broken' failed"):
        probe_task(
            Task(build_linear, data, nn.CrossEntropyLoss(), metrics={"broken": lambda o, t: 1 / 0})
        )
    with pytest.raises(TetherError, match="train_data is empty"):
        probe_task(Task(build_linear, TensorDataset(x[:0], y[:0]), nn.CrossEntropyLoss()))
    # a schedule with the method's own optimizer is tried on a stand-in (it failed in every
    # worker after start-up); a metric may not take the loss's name
    # which factory failed, and the form it takes (it said "the optimizer or schedule")
    with pytest.raises(
        TetherError, match=r"^building the schedule \(scheduler\(optimizer\) or .*step_size"
    ):
        probe_task(Task(build_linear, data, nn.CrossEntropyLoss(), scheduler=StepLR))
    with pytest.raises(TetherError, match=r"^building the optimizer \(optimizer\(params\)\)"):
        probe_task(Task(build_linear, data, nn.CrossEntropyLoss(), optimizer=lambda: None))
    with pytest.raises(TetherError, match="a metric cannot be named 'loss'"):
        probe_task(Task(build_linear, data, nn.CrossEntropyLoss(), metrics={"loss": accuracy}))
    # a metric of the other kind of task: accuracy on a regression scored 0% without a word,
    # mae on a classifier was torch's "shape '[2]' is invalid for input of size 20"
    numbers = TensorDataset(x, torch.randn(len(x)))
    with pytest.raises(TetherError, match=r"accuracy needs class scores .*takes mae or mse"):
        probe_task(
            Task(lambda: nn.Linear(4, 1), numbers, nn.MSELoss(), metrics={"accuracy": accuracy})
        )
    with pytest.raises(TetherError, match=r"mae needs one output per target.*takes accuracy"):
        probe_task(
            Task(build_linear, data, nn.CrossEntropyLoss(), metrics={"mae": mean_absolute_error})
        )


def test_a_target_names_a_metric_the_run_evaluates() -> None:
    x, y = _xy()
    data = TensorDataset(x, y)
    classes = Task(build_linear, data, nn.CrossEntropyLoss(), eval_data=data)
    probe_task(classes, target=parse_target("accuracy>=0.5"))  # class scores: accuracy
    probe_task(classes, target=parse_target("loss<=0.5"))
    # these ran to the end "not reached", whatever the model did
    named = Task(
        build_linear, data, nn.CrossEntropyLoss(), eval_data=data, metrics={"acc": accuracy}
    )
    with pytest.raises(
        TetherError, match=r"'accuracy' is not evaluated in this run; evaluated: loss, acc"
    ):
        probe_task(named, target=parse_target("accuracy>=0.5"))
    values = TensorDataset(x, torch.randn(len(x), 3))
    regression = Task(build_linear, values, nn.MSELoss(), eval_data=values)
    with pytest.raises(
        TetherError, match=r"'accuracy' is not evaluated in this run; evaluated: loss"
    ):
        probe_task(regression, target=parse_target("accuracy>=0.5"))
    with pytest.raises(TetherError, match=r"target loss<=5 needs eval_data"):
        probe_task(Task(build_linear, data, nn.CrossEntropyLoss()), target=parse_target("loss<=5"))


def test_import_paths_resolve_on_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mytask.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "from torch.utils.data import TensorDataset\n"
        "def build():\n    return nn.Linear(4, 2)\n"
        "def load():\n"
        "    x = torch.randn(16, 4); y = (x[:, 0] > 0).long()\n"
        "    return TensorDataset(x, y), TensorDataset(x, y)\n"
        "def halved(outputs, targets):\n"
        "    return torch.nn.functional.cross_entropy(outputs, targets) / 2\n"
        "def arrays():\n"
        "    x = torch.randn(16, 4).numpy(); y = (x[:, 0] > 0).astype('int64')\n"
        "    return (x, y), None\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    config = TrainConfig(
        model="mytask:build",
        dataset="mytask:load",
        loss="mytask:halved",
        optimizer="adamw",
        metrics=("accuracy",),
        lr_schedule="cosine",
    )
    task = task_from_config(config)
    assert isinstance(task.build_model(), nn.Linear) and len(task.train_data) == 16  # type: ignore[arg-type]
    assert task.loss.__name__ == "halved"  # type: ignore[attr-defined]
    assert isinstance(task.optimizer([nn.Parameter(torch.zeros(1))]), torch.optim.AdamW)  # type: ignore[misc]
    assert task.scheduler is not None and task.metrics == {"accuracy": accuracy}
    with pytest.raises(TetherError, match=r"module mytask has no attribute 'nope'"):
        load_object("mytask:nope", "model")
    with pytest.raises(TetherError, match=r"no module named 'nomodule'"):
        load_object("nomodule.sub:f", "loss")
    with pytest.raises(TetherError, match="module:attribute"):
        load_object("mytask:", "model")
    # arrays where a data set was due: torch's "stack expects each tensor to be equal size"
    with pytest.raises(TetherError, match=r"returned train as a tuple of ndarray and ndarray: "):
        load_data(dataclasses.replace(config, dataset="mytask:arrays"))
    assert infer_shape_and_classes(task.train_data) == ((4,), 2)
    with pytest.raises(TetherError, match="built-in model 'lenet5' needs images"):
        task_from_config(TrainConfig(model="lenet5", dataset="mytask:load"))
    # the MLP flattens its input: rows of 4 features fit it (it refused them as not images)
    mlp = task_from_config(TrainConfig(model="mlp", dataset="mytask:load")).build_model()
    assert mlp(torch.randn(3, 4)).shape == (3, 2)


def test_a_list_of_samples_is_a_data_set_of_its_own(tmp_path: Path) -> None:
    # A list has __len__ and __getitem__ (map-style, as torch's DataLoader takes it); it was
    # taken for a list of names: "unknown dataset 'list'"
    from tether.api.fit import _config

    x, y = _xy()
    samples = list(zip(x, y, strict=True))
    config, _, supplied = _config(
        build_linear, samples, nn.CrossEntropyLoss(), None, None, ["accuracy"], "sync-sgd",
        1, 1, 8, tmp_path / "run", None, None, False, {},
    )  # fmt: skip
    assert "dataset" in supplied and "metrics" not in supplied  # a list of metric names
    assert config.dataset == "list"


def restarts(optimizer: torch.optim.Optimizer, total_steps: int) -> object:
    return torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=total_steps // 4)


def test_the_dry_run_builds_a_schedule_for_the_runs_length() -> None:
    # A schedule sized by the run (T_0 a quarter of it) was tried on a run of 1 step (T_0 = 0)
    # and refused, though the run would have trained
    from tether.config import TrainConfig

    x, y = _xy()
    task = Task(build_linear, TensorDataset(x, y), nn.CrossEntropyLoss(), scheduler=restarts)
    probe_task(task, config=TrainConfig(method="sync-sgd", workers=1, steps=8, batch_size=4))
    with pytest.raises(TetherError, match="T_0"):
        probe_task(task)  # without the run's config: a length of one step


def test_a_targets_comparison_reads_as_on_the_command_line() -> None:
    # 'accuracy>0.9' on the command line means >=; (metric, ">", value) was refused by fit
    from tether.api.fit import _target

    assert _target(("accuracy", ">", 0.9)) == _target(("accuracy", ">=", 0.9)) == "accuracy>=0.9"
    assert _target(("loss", "<", 0.3)) == "loss<=0.3"
    with pytest.raises(TetherError, match="target must be"):
        _target(("accuracy", "=", 0.9))
