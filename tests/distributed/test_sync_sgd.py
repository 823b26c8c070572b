"""sync-sgd against its oracles: one process on the global batch, and PyTorch DDP.

The oracle: N-worker sync SGD must equal one process with the same global batch. All
variants run inside one spawned group per world size, since starting a gloo group costs seconds
(the 4-rank one shared with other modules: tests/distributed/conftest.py).
Tolerance: 1e-5 relative (max abs difference over max abs value) after 5 momentum steps. The
float32 sums differ only in association order between the all-reduce and the single-process mean.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from tests.method_drive import cross_entropy_step
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data import GlobalBatchSampler
from tether.launch.spawn import run_spawned
from tether.methods import MethodContext
from tether.methods.sync_sgd import SyncSGD
from tether.models import build_model

STEPS = 5
PER_WORKER = 8
LR, MOMENTUM, WD = 0.05, 0.9, 1e-4
REL_TOL = 1e-5
# fp16/bf16 on the wire (pre-divided by P): each gradient element within about P*u of its mean,
# u = 2^-11 / 2^-8; after 5 steps the weights differ from the fp32 run by less than this.
COMPRESSED_TOL = {"fp16": 1e-3, "bf16_ring": 1e-2}
# 1000 float32 elements: LeNet-5's parameters (150, 6, 2400, ...) straddle bucket boundaries.
SPLITTING_BUCKET_MB = 1000 * 4 / 2**20


def _data(samples: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    return torch.randn(samples, 1, 28, 28, generator=gen), torch.randint(
        0, 10, (samples,), generator=gen
    )


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("lenet5", (1, 28, 28), 10)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _train_tether(rank: int, world: int, bucket_mb: float, **options: str) -> torch.Tensor:
    x, y = _data()
    config = TrainConfig(lr=LR, momentum=MOMENTUM, weight_decay=WD, bucket_mb=bucket_mb, **options)  # type: ignore[arg-type]
    method = SyncSGD(_model(), MethodContext(config, TorchTransport(), torch.device("cpu")))
    sampler = GlobalBatchSampler(len(x), PER_WORKER * world, seed=3)
    for step in range(STEPS):
        idx = sampler.worker_indices(step, rank, world)
        cross_entropy_step(method, x[idx], y[idx])
    layout_buckets = len(method.bucketer.layout.buckets)
    return torch.cat([_flat(method.model), torch.tensor([float(layout_buckets)])])


def _train_ddp(rank: int, world: int) -> torch.Tensor:
    x, y = _data()
    ddp = DistributedDataParallel(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    sampler = GlobalBatchSampler(len(x), PER_WORKER * world, seed=3)
    for step in range(STEPS):
        idx = sampler.worker_indices(step, rank, world)
        opt.zero_grad()
        F.cross_entropy(ddp(x[idx]), y[idx]).backward()
        opt.step()
    return _flat(ddp.module)


def _batch_norm_stats(rank: int, world: int) -> dict[str, torch.Tensor]:
    """Replicas of a batch-norm model see different shards, so their running stats differ until
    eval_model() averages them."""
    x, y = _data()
    torch.manual_seed(0)
    model = build_model("resnet8", (1, 28, 28), 10)
    method = SyncSGD(model, MethodContext(TrainConfig(), TorchTransport(), torch.device("cpu")))
    idx = GlobalBatchSampler(len(x), PER_WORKER * world, seed=3).worker_indices(0, rank, world)
    cross_entropy_step(method, x[idx], y[idx])

    def stats() -> torch.Tensor:
        return torch.cat([b.reshape(-1) for b in model.buffers() if b.is_floating_point()])

    before = stats().clone()
    method.eval_model()
    return {"bn_before": before, "bn_after": stats()}


class Branches(torch.nn.Module):
    """A layer every rank uses, one only rank 0's forward takes, one no forward takes."""

    def __init__(self) -> None:
        super().__init__()
        self.everywhere = torch.nn.Linear(16, 10)
        self.rank0_only = torch.nn.Linear(16, 10)
        self.never = torch.nn.Linear(16, 10)
        self.take_branch = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)[:, :16]
        out = self.everywhere(x)
        return out + self.rank0_only(x) if self.take_branch else out


def _unused_parameters(rank: int, world: int) -> dict[str, torch.Tensor]:
    """sync-sgd with momentum and weight decay on :class:`Branches`: what each layer's
    parameters and gradients are after 3 steps."""
    x, y = _data()
    torch.manual_seed(0)
    model = Branches()
    model.take_branch = rank == 0
    config = TrainConfig(lr=LR, momentum=MOMENTUM, weight_decay=WD)
    method = SyncSGD(model, MethodContext(config, TorchTransport(), torch.device("cpu")))
    sampler = GlobalBatchSampler(len(x), PER_WORKER * world, seed=3)
    for step in range(3):
        idx = sampler.worker_indices(step, rank, world)
        cross_entropy_step(method, x[idx], y[idx])
    grads = {
        f"grad_{name}": torch.tensor(float(layer.weight.grad is None))
        for name, layer in (("rank0_only", model.rank0_only), ("never", model.never))
    }
    weights = {
        name: getattr(model, name).weight.detach().clone()
        for name in ("everywhere", "rank0_only", "never")
    }
    return {**grads, **weights}


def on_every_rank(rank: int, world: int) -> dict[str, torch.Tensor]:
    """Every variant on this rank (also this module's part of the 4-rank group)."""
    return {
        **_batch_norm_stats(rank, world),
        "fused_default": _train_tether(rank, world, 1.0),
        "fused_splitting": _train_tether(rank, world, SPLITTING_BUCKET_MB),
        "unfused": _train_tether(rank, world, 0.0),
        "ddp": _train_ddp(rank, world),
        # our all-reduce algorithms on the communication thread, fused and unfused
        "ring": _train_tether(rank, world, SPLITTING_BUCKET_MB, allreduce="ring"),
        "halving_doubling_unfused": _train_tether(rank, world, 0.0, allreduce="halving-doubling"),
        "fp16": _train_tether(rank, world, 1.0, compress="fp16"),
        "bf16_ring": _train_tether(rank, world, 1.0, allreduce="ring", compress="bf16"),
        **{f"unused_{k}": v for k, v in _unused_parameters(rank, world).items()},
    }


def _single_process(world: int) -> np.ndarray:
    x, y = _data()
    model = copy.deepcopy(_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    sampler = GlobalBatchSampler(len(x), PER_WORKER * world, seed=3)
    for step in range(STEPS):
        idx = sampler.global_indices(step)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return _flat(model).numpy()


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _check_unused_parameters(results: list[dict[str, np.ndarray]]) -> None:
    """A layer no rank used keeps no gradient and does not move, as in one process (before,
    its zero gradient let weight decay and momentum move it); one that rank 0 alone used keeps
    the group's mean gradient on every rank (rank 0's share), moving the replicas alike."""
    torch.manual_seed(0)
    initial = Branches()
    for res in results:
        assert res["unused_grad_never"].item() == 1.0  # .grad None
        assert res["unused_grad_rank0_only"].item() == 0.0
        np.testing.assert_array_equal(res["unused_never"], initial.never.weight.detach())
        assert not np.array_equal(res["unused_rank0_only"], initial.rank0_only.weight.detach())
        for name in ("unused_everywhere", "unused_rank0_only"):
            np.testing.assert_array_equal(res[name], results[0][name])


@pytest.mark.parametrize("world", [2, 4])
def test_sync_sgd_matches_single_process_and_ddp(
    world: int, request: pytest.FixtureRequest
) -> None:
    if world == 4:
        # (copies: the checks below pop what they have checked)
        results = [dict(r["sync-sgd"]) for r in request.getfixturevalue("four_ranks")[0]]
    else:
        results = run_spawned(on_every_rank, world, timeout_s=30)
    assert len(results) == world
    reference = _single_process(world)
    initial = _flat(_model()).numpy()
    assert _rel_err(initial, reference) > 1e-3, "training must move the weights"
    bn_before = [r.pop("bn_before") for r in results]
    assert not np.allclose(bn_before[0], bn_before[1]), "shards should give different stats"
    bn_mean = np.mean(bn_before, axis=0)
    for res in results:
        np.testing.assert_allclose(res.pop("bn_after"), bn_mean, rtol=1e-6, atol=1e-7)
    _check_unused_parameters(
        [{k: res.pop(k) for k in list(res) if k.startswith("unused_")} for res in results]
    )
    compressed = [{k: res.pop(k)[:-1] for k in COMPRESSED_TOL} for res in results]
    for rank, weights_by_name in enumerate(compressed):
        for name, w in weights_by_name.items():
            error = _rel_err(w, reference)
            assert 1e-7 < error < COMPRESSED_TOL[name], (rank, name, error)
            np.testing.assert_array_equal(w, compressed[0][name])
    for rank, res in enumerate(results):
        buckets = {k: int(v[-1]) for k, v in res.items() if k != "ddp"}
        weights = {k: (v[:-1] if k != "ddp" else v) for k, v in res.items()}
        # The splitting layout really cut parameters: more buckets than LeNet-5's 10 tensors.
        assert buckets["fused_splitting"] > 10 and buckets["fused_default"] == 1
        assert buckets["unfused"] == buckets["halving_doubling_unfused"] == 10
        for name, w in weights.items():
            assert _rel_err(w, reference) < REL_TOL, (rank, name, _rel_err(w, reference))
            # Replicas stay bitwise identical: every rank applies the same averaged gradient.
            np.testing.assert_array_equal(w, results[0][name][: len(w)])
        # Fusion changes only how the buffer is cut into messages. With 2 ranks each element is
        # one a+b, so the results are bitwise equal. With more ranks gloo's ring assigns elements
        # to chunks by message length, which changes the association order of the float sums:
        # equal within the stated tolerance.
        for name in ("fused_default", "fused_splitting", "ring"):
            if world == 2:
                np.testing.assert_array_equal(weights[name], weights["unfused"])
            else:
                assert _rel_err(weights[name], weights["unfused"]) < REL_TOL
