"""Model parallelism against the unsharded model, the way PyTorch's tensor-parallel tests check it:
every rank builds the same full model (same seed) and input, keeps a deep copy as the oracle,
shards another copy, and compares forward outputs, input gradients, weight gradients (each rank's
slice, gathered) and the weights after two momentum steps.

Tolerances: float64 1e-10 absolute (the sharded sums differ from the whole ones only in the order
of additions); float32 1e-5 relative to the largest value.

All of it runs in the 4-rank group shared with other modules (tests/distributed/conftest.py):
K = 4 over the whole group, K = 2 in each half of a 2 x 2 grid, the collectives of a column -> row
pair counted through the transport, 20 sync-sgd steps of the 2 x 2 grid against one process on
the global batch, and sync-easgd and local-sgd over the grid's data-parallel axis against the
same methods on unsharded replicas.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tether.api.context import Context
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data import GlobalBatchSampler
from tether.errors import TetherError
from tether.launch.env import DistEnv
from tether.methods import MethodContext, Placement, StepTimes
from tether.methods.local_sgd import LocalSGD
from tether.methods.sync_easgd import SyncEASGD
from tether.methods.sync_sgd import SyncSGD
from tether.optim import LAMB, LARS
from tether.parallel import (
    DistArray,
    ProcessGrid,
    check_plan,
    full_state_dict,
    parallelize,
    parse_plan,
    whole_tensors,
)
from tether.parallel.norms import clip_grad_norm_

F64_TOL = 1e-10
F32_REL_TOL = 1e-5
GRID_STEPS = 20
PER_WORKER = 8


class WideMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.fc2 = nn.Linear(16, 8)
        self.fc3 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


MLP_PLAN = {"fc1": "column", "fc2": "row", "fc3": "column"}


class SmallCNN(nn.Module):
    """conv (channel) -> conv (input-channel) -> flatten -> fc (column) -> fc (row)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 2 * 2, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


CNN_PLAN = {"conv1": "channel", "conv2": "input-channel", "fc1": "column", "fc2": "row"}


class FlattenCNN(nn.Module):
    """Channel-sharded images flattened straight into a row-parallel layer (no gather), a
    batch norm that must see whole channels (gathers), and a ``view`` in the forward code."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.conv2(x)) * 0.5 + 0.1, 2)
        return self.fc(x.view(x.size(0), -1))


FLATTEN_PLAN = {"conv1": "channel", "conv2": "channel", "fc": "row"}


class CountingTransport:
    """A transport that counts the collectives the sharded layers call on it."""

    def __init__(self, inner: TorchTransport) -> None:
        self.inner, self.rank, self.world_size = inner, inner.rank, inner.world_size
        self.calls: Counter[str] = Counter()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False) -> Any:
        self.calls["all_reduce"] += 1
        return self.inner.all_reduce(tensor, op, async_op)

    def all_gather(self, tensor: torch.Tensor) -> None:
        self.calls["all_gather"] += 1
        self.inner.all_gather(tensor)

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Any:
        return self.inner.broadcast(tensor, src, async_op)  # parallelize's start, not counted


def _input(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(*shape, generator=gen, dtype=dtype), torch.randint(0, 4, (shape[0],))


def _gathered_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return whole_tensors(model, {n: p.grad for n, p in model.named_parameters()})


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _against_unsharded(
    build: type[nn.Module], plan: dict[str, str], group: Any, shape: tuple[int, ...], dtype: Any
) -> dict[str, float]:
    """Largest differences between the sharded and the unsharded model: output, input gradient,
    weight gradients, weights after two momentum-SGD steps (relative for float32)."""
    torch.manual_seed(0)
    full = build().to(dtype)
    oracle, sharded = copy.deepcopy(full), parallelize(copy.deepcopy(full), plan, group)
    x, y = _input(shape, dtype)
    results: dict[str, float] = {}
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (oracle, sharded)]
    for step in range(2):
        outs, xs = [], []
        for model, opt in zip((oracle, sharded), opts, strict=True):
            xi = x.clone().requires_grad_()
            opt.zero_grad()
            out = model(xi)
            F.cross_entropy(out, y).backward()
            outs.append(out.detach())
            xs.append(xi)
        if step == 0:
            assert not isinstance(outs[1], DistArray), "the model's output is made whole"
            scale = 1.0 if dtype == torch.float64 else float(outs[0].abs().max())
            results["output"] = float((outs[0] - outs[1]).abs().max()) / scale
            results["input_grad"] = float((xs[0].grad - xs[1].grad).abs().max()) / scale  # type: ignore[operator]
            results["weight_grad"] = _max_diff(
                {n: p.grad for n, p in oracle.named_parameters()},  # type: ignore[misc]
                _gathered_grads(sharded),
            )
        for opt in opts:
            opt.step()
    results["weights"] = _max_diff(oracle.state_dict(), full_state_dict(sharded))
    return results


def _unseeded_ranks_share_one_model(group: TorchTransport) -> float:
    """Each rank of the group builds its model from its own seed (a loop that does not seed):
    after parallelize the group holds the one model of its rank 0, slices and the layers
    outside the plan alike (each rank trained a model of its own before). Returns the largest
    difference between the gathered model and group rank 0's original."""
    torch.manual_seed(100 + TorchTransport().rank)
    own = WideMLP()
    first = copy.deepcopy(own.state_dict())
    for tensor in first.values():
        group.broadcast(tensor, src=0)  # group rank 0's original, to compare with
    sharded = parallelize(own, MLP_PLAN, group)
    differs = _max_diff(first, full_state_dict(sharded))
    # and one random state: a dropout outside the split layers draws the same mask on every
    # rank of the group (before, each rank its own: the replicated parts drifted apart)
    mask = F.dropout(torch.ones(64), 0.5, training=True)
    theirs = mask.clone()
    group.broadcast(theirs, src=0)
    return max(differs, float((mask - theirs).abs().max()))


def _column_row_counts(group: TorchTransport) -> dict[str, int]:
    """Collectives of one forward and one backward through an unsharded layer, then a column ->
    row pair: one all-reduce each way, nothing else."""
    counting = CountingTransport(group)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    parallelize(model, {"1": "column", "3": "row"}, counting)
    x, _ = _input((5, 6), torch.float32)
    out = model(x)
    forward = dict(counting.calls)
    out.sum().backward()
    total = dict(counting.calls)
    return {
        "forward_all_reduce": forward.get("all_reduce", 0),
        "forward_all_gather": forward.get("all_gather", 0),
        "backward_all_reduce": total.get("all_reduce", 0) - forward.get("all_reduce", 0),
        "backward_all_gather": total.get("all_gather", 0) - forward.get("all_gather", 0),
    }


def _flatten_forward_counts(group: TorchTransport) -> dict[str, int]:
    """FlattenCNN's forward moves what its consumers need and nothing more: the batch norm
    gathers conv1's channels (one all-gather), the arithmetic, pooling and ``view`` keep conv2's
    channel slices, which the row-parallel layer takes as they are (its one all-reduce)."""
    counting = CountingTransport(group)
    torch.manual_seed(0)
    model = parallelize(FlattenCNN(), FLATTEN_PLAN, counting)
    model(_input((5, 1, 8, 8), torch.float32)[0])
    return dict(counting.calls)


def _optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    if name == "lars":
        return LARS(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
    if name == "lamb":
        return LAMB(params, lr=0.01, weight_decay=1e-4)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _grid_sync_sgd(
    world: TorchTransport, clip: float | None = None, optimizer: str = "sgd"
) -> dict[str, float]:
    """20 sync-sgd steps on a 2 (data) x 2 (model) grid against one process on the global
    batch; the data-parallel group holds the same slices, so sync-sgd runs over it. With
    ``clip``, both clip the gradient's global norm (ours: of every slice together); with LARS
    or LAMB, the trust ratios take the norms of whole tensors (ours: summed over the group)."""
    grid = ProcessGrid.build(world, 2, timeout_s=30)
    gen = torch.Generator().manual_seed(11)
    x, y = torch.randn(96, 12, generator=gen), torch.randint(0, 4, (96,), generator=gen)
    torch.manual_seed(0)
    full = WideMLP()
    oracle = copy.deepcopy(full)
    sharded = parallelize(copy.deepcopy(full), MLP_PLAN, grid.model)
    config = TrainConfig(lr=0.05, momentum=0.9, bucket_mb=0.0001, clip_grad_norm=clip)
    context = MethodContext(config, grid.data, torch.device("cpu"), grid=grid)
    method = SyncSGD(sharded, context, _optimizer(optimizer, sharded.parameters()))
    method.start()
    opt = _optimizer(optimizer, oracle.parameters())
    sampler = GlobalBatchSampler(len(x), PER_WORKER * grid.data_parallel, seed=3)
    for step in range(GRID_STEPS):
        idx = sampler.worker_indices(step, grid.data_rank, grid.data_parallel)

        def backward(idx: torch.Tensor = idx) -> torch.Tensor:
            loss = F.cross_entropy(method.model(x[idx]), y[idx])
            loss.backward()
            return loss.detach()

        method.zero_grad()
        method.step(backward, StepTimes())
        whole = sampler.worker_indices(step, 0, 1)
        opt.zero_grad()
        F.cross_entropy(oracle(x[whole]), y[whole]).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(oracle.parameters(), clip)
        opt.step()
    method.finish(None)
    ours, theirs = full_state_dict(method.model), oracle.state_dict()
    scale = max(float(v.abs().max()) for v in theirs.values())
    return {
        "grid_weights": _max_diff(ours, theirs) / scale,
        "model_rank": float(grid.model_rank),
        "data_rank": float(grid.data_rank),
    }


def _grid_overflow(world: TorchTransport, method_cls: Any) -> dict[str, Any]:
    """fp16 on the 2 x 2 grid, an inf forced into rank 1's slice of fc1's weight gradient at
    step 2 (a slice no other rank holds): which ranks skip that step."""
    grid = ProcessGrid.build(world, 2, timeout_s=30)
    config = TrainConfig(precision="fp16", lr=0.1, tau=50, bucket_mb=0.0001)
    torch.manual_seed(0)
    model = parallelize(WideMLP(), MLP_PLAN, grid.model)
    cpu = torch.device("cpu")
    method = method_cls(model, MethodContext(config, grid.data, cpu, grid=grid))
    method.start()
    moved_at_bad_step = None
    for step in range(4):
        gen = torch.Generator().manual_seed(100 * grid.data_rank + step)
        x, y = torch.randn(8, 12, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        hook = None
        if world.rank == 1 and step == 2:
            hook = model.fc1.weight.register_hook(
                lambda g: g.index_fill(1, torch.tensor([0]), float("inf"))
            )

        def backward(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            with method.precision.autocast(cpu):
                loss = F.cross_entropy(model(x), y)
            method.backward_loss(loss)
            return loss.detach()

        before = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
        method.zero_grad()
        method.step(backward, StepTimes())
        if hook is not None:
            hook.remove()
        after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        if step == 2:
            moved_at_bad_step = bool((after != before).any())
    method.finish(None)
    return {"moved_at_bad_step": moved_at_bad_step, "skipped": method.scaler.skipped}


def _clipped_gradients(group: TorchTransport) -> dict[str, float]:
    """parallel.clip_grad_norm_ on the sharded model against torch's on the unsharded one:
    the norm, and the clipped gradients (gathered)."""
    torch.manual_seed(0)
    full = WideMLP()
    oracle, sharded = copy.deepcopy(full), parallelize(copy.deepcopy(full), MLP_PLAN, group)
    x, y = _input((6, 12), torch.float32)
    for model in (oracle, sharded):
        F.cross_entropy(model(x), y).backward()
    want = torch.nn.utils.clip_grad_norm_(oracle.parameters(), 0.05)
    got = clip_grad_norm_(sharded, 0.05)
    return {
        "norm": abs(float(got) - float(want)) / float(want),
        "grads": _max_diff(
            {n: p.grad for n, p in oracle.named_parameters()},  # type: ignore[misc]
            _gathered_grads(sharded),
        ),
    }


def _grid_method_vs_unsharded(world: TorchTransport, method_cls: Any) -> float:
    """A data-parallel method over the grid's data-parallel groups, each model group one of its
    workers, against the same method on unsharded replicas over groups of the same ranks (a
    second grid, so the two runs' collectives never share a group): largest relative difference
    of the evaluated models (the center for sync-easgd) after ``GRID_STEPS`` steps."""
    grid = ProcessGrid.build(world, 2, timeout_s=30)
    twin = ProcessGrid.build(world, 2, timeout_s=30)
    gen = torch.Generator().manual_seed(11)
    x, y = torch.randn(96, 12, generator=gen), torch.randint(0, 4, (96,), generator=gen)
    torch.manual_seed(0)
    full = WideMLP()
    config = TrainConfig(lr=0.05, tau=2, bucket_mb=0.0001)
    cpu = torch.device("cpu")
    ours = method_cls(
        parallelize(copy.deepcopy(full), MLP_PLAN, grid.model),
        MethodContext(config, grid.data, cpu, grid=grid),
    )
    theirs = method_cls(copy.deepcopy(full), MethodContext(config, twin.data, cpu))
    sampler = GlobalBatchSampler(len(x), PER_WORKER * grid.data_parallel, seed=3)
    for method in (ours, theirs):
        method.start()
    for step in range(GRID_STEPS):
        idx = sampler.worker_indices(step, grid.data_rank, grid.data_parallel)
        for method in (ours, theirs):

            def backward(m: Any = method, idx: torch.Tensor = idx) -> torch.Tensor:
                loss = F.cross_entropy(m.model(x[idx]), y[idx])
                loss.backward()
                return loss.detach()

            method.zero_grad()
            method.step(backward, StepTimes())
    for method in (ours, theirs):
        method.finish(None)
    got = full_state_dict(ours.eval_model())
    want = theirs.eval_model().state_dict()
    scale = max(float(v.abs().max()) for v in want.values())
    return _max_diff(got, want) / scale


def _own_loop_context(world: TorchTransport) -> dict[str, Any]:
    """The user's-own-loop path (tether.init's Context) on a 2 x 2 grid: the sampler follows the
    data axis, wrap refuses an unsplit model, and 4 sync-easgd steps through ctx.parallelize +
    ctx.wrap equal the method on unsharded replicas fed the same batches."""
    config = TrainConfig(method="sync-easgd", workers=4, model_parallel=2, lr=0.1, batch_size=8)
    env = DistEnv(world.rank, 4, world.rank, 4, "127.0.0.1", None, None)
    ctx = Context(config, world, torch.device("cpu"), env, Placement())
    out: dict[str, Any] = {"workers": ctx.workers, "worker_index": ctx.worker_index}
    try:
        ctx.wrap(WideMLP(), None)
    except TetherError as exc:
        out["unsplit"] = str(exc)
    twin = ProcessGrid.build(world, 2, timeout_s=30)
    torch.manual_seed(0)
    full = WideMLP()
    net = ctx.parallelize(copy.deepcopy(full), MLP_PLAN)
    model, opt = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
    theirs = SyncEASGD(copy.deepcopy(full), MethodContext(config, twin.data, torch.device("cpu")))
    theirs.start()
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(64, 12, generator=gen), torch.randint(0, 4, (64,), generator=gen)
    data = TensorDataset(x, y)
    batches = DataLoader(data, batch_size=8, sampler=ctx.sampler(data, 8))
    for xb, yb in batches:  # 64 samples / (2 model groups x 8): 4 steps
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()

        def backward(xb: torch.Tensor = xb, yb: torch.Tensor = yb) -> torch.Tensor:
            loss = F.cross_entropy(theirs.model(xb), yb)
            loss.backward()
            return loss.detach()

        theirs.zero_grad()
        theirs.step(backward, StepTimes())
    got = full_state_dict(ctx.eval_model())
    want = theirs.eval_model().state_dict()
    assert ctx.method is not None
    for method in (ctx.method, theirs):
        method.finish(None)
    scale = max(float(v.abs().max()) for v in want.values())
    out["weights"] = _max_diff(got, want) / scale
    out["steps"] = theirs.local_step
    return out


def on_every_rank(rank: int, world_size: int) -> dict[str, Any]:
    """This module's part of the 4-rank group."""
    world = TorchTransport()
    out: dict[str, Any] = {}
    for name, build, plan, shape in (
        ("mlp", WideMLP, MLP_PLAN, (6, 12)),
        ("cnn", SmallCNN, CNN_PLAN, (5, 1, 8, 8)),
        ("flatten", FlattenCNN, FLATTEN_PLAN, (5, 1, 8, 8)),
    ):
        out[f"k4/{name}/f64"] = _against_unsharded(build, plan, world, shape, torch.float64)
    grid = ProcessGrid.build(world, 2, timeout_s=30)
    for name, build, plan, shape in (
        ("mlp", WideMLP, MLP_PLAN, (6, 12)),
        ("cnn", SmallCNN, CNN_PLAN, (5, 1, 8, 8)),
        ("flatten", FlattenCNN, FLATTEN_PLAN, (5, 1, 8, 8)),
    ):
        for label, dtype in (("f64", torch.float64), ("f32", torch.float32)):
            out[f"k2/{name}/{label}"] = _against_unsharded(build, plan, grid.model, shape, dtype)
    out["unseeded"] = _unseeded_ranks_share_one_model(grid.model)
    out["counts"] = _column_row_counts(grid.model)
    out["flatten_counts"] = _flatten_forward_counts(grid.model)
    out["grid"] = _grid_sync_sgd(world)
    out["grid_clipped"] = _grid_sync_sgd(world, clip=0.05)
    out["grid_lars"] = _grid_sync_sgd(world, optimizer="lars")
    out["grid_lamb"] = _grid_sync_sgd(world, optimizer="lamb")
    out["clipped"] = _clipped_gradients(grid.model)
    out["overflow_sync_sgd"] = _grid_overflow(world, SyncSGD)
    out["overflow_local_sgd"] = _grid_overflow(world, LocalSGD)
    out["own_loop"] = _own_loop_context(world)
    out["grid_sync_easgd"] = _grid_method_vs_unsharded(world, SyncEASGD)
    out["grid_local_sgd"] = _grid_method_vs_unsharded(world, LocalSGD)
    return out


@pytest.fixture(scope="module")
def results(four_ranks: tuple[list[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    return [rank["model-parallel"] for rank in four_ranks[0]]


@pytest.mark.parametrize("case", ["mlp", "cnn", "flatten"])
@pytest.mark.parametrize("grid", ["k4", "k2"])
def test_sharded_model_equals_the_unsharded_one(results: list[dict[str, Any]], case, grid):
    for rank, result in enumerate(results):
        diffs = result[f"{grid}/{case}/f64"]
        assert max(diffs.values()) < F64_TOL, (rank, diffs)
        if grid == "k2":
            diffs32 = result[f"{grid}/{case}/f32"]
            assert max(diffs32.values()) < F32_REL_TOL, (rank, diffs32)


def test_a_model_group_holds_its_rank_0s_model_whatever_each_rank_built(
    results: list[dict[str, Any]],
):
    assert [result["unseeded"] for result in results] == [0.0] * len(results)


def test_a_column_row_pair_costs_one_all_reduce_each_way(results: list[dict[str, Any]]):
    for result in results:
        assert result["counts"] == {
            "forward_all_reduce": 1,
            "forward_all_gather": 0,
            "backward_all_reduce": 1,
            "backward_all_gather": 0,
        }


def test_activations_move_only_where_a_consumer_needs_them(results: list[dict[str, Any]]):
    for result in results:
        assert result["flatten_counts"] == {"all_gather": 1, "all_reduce": 1}


def test_grid_sync_sgd_equals_one_process_on_the_global_batch(results: list[dict[str, Any]]):
    places = set()
    for result in results:
        grid = result["grid"]
        assert grid["grid_weights"] < F32_REL_TOL, grid
        places.add((grid["data_rank"], grid["model_rank"]))
    assert places == {(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)}


@pytest.mark.parametrize("method", ["sync_easgd", "local_sgd"])
def test_elastic_and_local_averaging_over_the_data_parallel_axis(
    results: list[dict[str, Any]], method: str
):
    """Each model group acts as one sync-easgd (local-sgd) worker: the run equals the method on
    unsharded replicas, one per model group."""
    for result in results:
        assert result[f"grid_{method}"] < F32_REL_TOL, result[f"grid_{method}"]


def test_clipping_takes_the_norm_of_every_slice_together(results: list[dict[str, Any]]):
    for result in results:
        assert result["clipped"]["norm"] < F32_REL_TOL, result["clipped"]
        assert result["clipped"]["grads"] < 1e-7, result["clipped"]
        assert result["grid_clipped"]["grid_weights"] < F32_REL_TOL, result["grid_clipped"]


@pytest.mark.parametrize("optimizer", ["lars", "lamb"])
def test_trust_ratios_take_the_norms_of_whole_tensors(
    results: list[dict[str, Any]], optimizer: str
):
    """LARS and LAMB on the 2 x 2 grid equal them on one process (their per-tensor norms of a
    split weight are summed over the model group through their reduce_norms hook)."""
    for result in results:
        assert result[f"grid_{optimizer}"]["grid_weights"] < F32_REL_TOL, result[
            f"grid_{optimizer}"
        ]


def test_an_overflow_in_one_slice_is_skipped_by_its_whole_model_group(
    results: list[dict[str, Any]],
):
    """sync-sgd: every rank of the grid skips the step (the data-parallel sum and the model
    group's MAX); local-sgd: the two ranks of rank 1's model group skip it, the other model
    group (another local-sgd worker) does not."""
    for rank, result in enumerate(results):
        sync = result["overflow_sync_sgd"]
        assert sync == {"moved_at_bad_step": False, "skipped": 1}, (rank, sync)
        local = result["overflow_local_sgd"]
        in_group = rank in (0, 1)
        assert local == {"moved_at_bad_step": not in_group, "skipped": int(in_group)}, (
            rank,
            local,
        )


def test_own_loop_under_model_parallelism(results: list[dict[str, Any]]):
    for rank, result in enumerate(results):
        own = result["own_loop"]
        assert (own["workers"], own["worker_index"]) == (2, rank // 2), own
        assert "call model = ctx.parallelize(model) before" in own["unsplit"]
        assert own["weights"] < F32_REL_TOL and own["steps"] == 4, own


# -- plans checked before anything runs (one process) -------------------------------------------
@pytest.mark.parametrize(
    "plan, parts, message",
    [
        ({"fc9": "column"}, 2, "has no layer 'fc9'; its Linear/Conv2d layers are fc1, fc2, fc3"),
        ({"fc1": "column"}, 3, "fc1 has 16 output features, which do not split into 3"),
        ({"fc3": "row"}, 3, "fc3 has 8 input features, which do not split into 3"),
        ({"fc1": "channel"}, 2, "fc1 is a Linear layer, which splits 'column' or 'row'"),
        ({}, 2, "needs a plan naming the layers to split, .* in Python; this model's"),
    ],
)
def test_bad_plans_are_one_line(plan, parts, message):
    with pytest.raises(TetherError, match=message) as info:
        check_plan(WideMLP(), plan, parts)
    assert "\n" not in str(info.value)


def test_a_layer_without_a_sharding_rule_is_refused():
    model = FlattenCNN()
    with pytest.raises(TetherError, match="norm is a BatchNorm2d; only Linear and Conv2d"):
        check_plan(model, {"norm": "column"}, 2)
    # a subclass or a parametrised layer computes or reads its weight its own way: a slice of
    # it trained without its parametrisation, or failed in every worker (attention's out_proj)
    attention = nn.MultiheadAttention(8, 2)
    with pytest.raises(TetherError, match="out_proj is a NonDynamicallyQuantizableLinear; only"):
        check_plan(attention, {"out_proj": "row"}, 2)
    normed = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(4, 4)))
    with pytest.raises(TetherError, match="0 is a parametrised ParametrizedLinear; only plain"):
        check_plan(normed, {"0": "column"}, 2)
    grouped = nn.Sequential(nn.Conv2d(4, 4, 3, groups=2))
    with pytest.raises(TetherError, match="grouped or non-zero-padded Conv2d"):
        check_plan(grouped, {"0": "channel"}, 2)


@pytest.mark.parametrize(
    "text, message",
    [
        ("fc1", "a parallel plan entry is layer=kind"),
        ("fc1=diagonal", "kinds are column, row, channel, input-channel"),
        ("fc1=column,fc1=row", "names layer 'fc1' twice"),
    ],
)
def test_bad_plan_text(text, message):
    with pytest.raises(TetherError, match=message):
        parse_plan(text)


def test_plan_text_forms_agree():
    assert parse_plan("fc1=column, fc2=row") == parse_plan(["fc1=column", "fc2=row"])
    assert parse_plan({"fc1": "column", "fc2": "row"}) == {"fc1": "column", "fc2": "row"}
