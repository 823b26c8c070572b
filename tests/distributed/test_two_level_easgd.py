"""two-level-easgd on 4 ranks: with one node it is sync-sgd and with one rank per node
sync-easgd, bitwise; with 2 nodes of 2 it is deterministic and follows its rule (the node's mean
gradient inside a node, elastic rounds between the nodes), against a one-process reference; the
nodes a launcher reports (its local world size) give the very same run as ranks_per_node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tests.method_drive import cross_entropy_step, loss_and_gradient
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.data import GlobalBatchSampler
from tether.methods import METHODS, MethodContext, Placement, StepTimes
from tether.methods.flat import flatten_parameters
from tether.models import build_model

STEPS, BATCH, LR, MU, TAU = 6, 4, 0.1, 0.9, 2
WORLD = 4
REL_TOL = 1e-6


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return torch.randn(96, 1, 8, 8, generator=gen), torch.randint(0, 10, (96,), generator=gen)


def _model():
    torch.manual_seed(0)
    return build_model("mlp", (1, 8, 8), 10)


def _batch(step: int, index: int):
    x, y = _data()
    idx = GlobalBatchSampler(len(x), BATCH * WORLD, seed=1).worker_indices(step, index, WORLD)
    return x[idx], y[idx]


def _drive(
    rank: int, method: str, momentum: bool, placement: Placement | None = None, **change
) -> dict:
    """STEPS steps of ``method`` on this rank; returns its replica (and center, if any)."""
    config = TrainConfig(lr=LR, tau=TAU, weight_decay=0.0, **change)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MU if momentum else 0.0)
    context = MethodContext(config, TorchTransport(), torch.device("cpu"), placement or Placement())
    m = METHODS.get(method)(model, context, optimizer)
    m.start()
    for step in range(STEPS):
        cross_entropy_step(m, *_batch(step, rank))
    evaluated = torch.cat([p.detach().reshape(-1) for p in m.eval_model().parameters()])
    replica = torch.cat([p.detach().reshape(-1) for p in m.model.parameters()])
    m.finish(None)
    return {"replica": replica, "evaluated": evaluated, **m.summary_extra()}  # numpy, back home


def _fp16_overflow_on_rank_1(rank: int) -> dict:
    """2 nodes of 2, fp16, an inf in rank 1's loss at step 2: what each rank's scaler did."""
    config = TrainConfig(lr=LR, tau=TAU, weight_decay=0.0, precision="fp16", ranks_per_node=2)
    model = _model()
    context = MethodContext(config, TorchTransport(), torch.device("cpu"), Placement())
    m = METHODS.get("two-level-easgd")(model, context, torch.optim.SGD(model.parameters(), lr=LR))
    m.start()
    for step in range(STEPS):
        x, y = _batch(step, rank)

        def backward(x: torch.Tensor = x, y: torch.Tensor = y, bad: bool = step == 2) -> Any:
            with m.precision.autocast(torch.device("cpu")):
                loss = F.cross_entropy(m.model(x), y)
            m.backward_loss(loss * float("inf") if bad and rank == 1 else loss)
            return loss.detach()

        m.zero_grad()
        m.step(backward, StepTimes())
    m.finish(None)
    return {"skipped": m.scaler.skipped, "rounds": m.rounds}


def on_every_rank(rank: int, world: int) -> dict:
    """This module's part of the 4-rank group (tests/distributed/conftest.py)."""
    del world
    return {
        "sync-sgd": _drive(rank, "sync-sgd", momentum=True),
        "one-node": _drive(rank, "two-level-easgd", momentum=True, ranks_per_node=WORLD),
        "sync-easgd": _drive(rank, "sync-easgd", momentum=False),
        "rank-nodes": _drive(rank, "two-level-easgd", momentum=False, ranks_per_node=1),
        "2x2": _drive(rank, "two-level-easgd", momentum=False, ranks_per_node=2),
        "2x2-again": _drive(rank, "two-level-easgd", momentum=False, ranks_per_node=2),
        # the nodes as a launcher reports them (LOCAL_WORLD_SIZE 2), no ranks_per_node
        "2x2-launcher": _drive(
            rank, "two-level-easgd", momentum=False, placement=Placement(local_world_size=2)
        ),
        "2x2-ring": _drive(
            rank, "two-level-easgd", momentum=False, ranks_per_node=2, allreduce="ring"
        ),
        "2x2-fp16": _fp16_overflow_on_rank_1(rank),
    }


def reference_two_level(nodes: int, size: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One process: each node's replica steps with its ranks' mean gradient; every TAU steps
    the nodes' elastic round with one center."""
    alpha = 0.9 / nodes
    models = [_model() for _ in range(nodes)]
    xs = [flatten_parameters(m) for m in models]
    center = xs[0].clone()
    for step in range(STEPS):
        for n, (model, x) in enumerate(zip(models, xs, strict=True)):
            ranks = range(n * size, (n + 1) * size)
            grads = [loss_and_gradient(model, *_batch(step, r))[1] for r in ranks]
            x.sub_(torch.stack(grads).mean(0), alpha=LR)
        if (step + 1) % TAU == 0:
            ds = [x - center for x in xs]
            for x, d in zip(xs, ds, strict=True):
                x.sub_(d, alpha=alpha)
            center.add_(torch.stack(ds).sum(0), alpha=alpha)
    return center, xs


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).abs().max()) <= REL_TOL * float(b.abs().max())


def test_two_level_reduces_to_sync_sgd_and_sync_easgd_and_follows_its_rule(
    four_ranks: tuple[list[dict], Path],
) -> None:
    ranks, _ = four_ranks
    assert len(ranks) == WORLD
    results = [
        {case: {k: torch.as_tensor(v) for k, v in values.items()} for case, values in r.items()}
        for r in (rank["two-level"] for rank in ranks)
    ]
    center, xs = reference_two_level(nodes=2, size=2)
    for rank, res in enumerate(results):
        # One node: sync-sgd, the very same operations.
        assert torch.equal(res["one-node"]["replica"], res["sync-sgd"]["replica"]), rank
        assert torch.equal(res["one-node"]["evaluated"], res["sync-sgd"]["evaluated"]), rank
        assert res["one-node"]["rounds"] == 0 and res["one-node"]["nodes"] == 1
        # One rank per node: sync-easgd, replica and center.
        for key in ("replica", "evaluated"):
            assert torch.equal(res["rank-nodes"][key], res["sync-easgd"][key]), (rank, key)
        assert res["rank-nodes"]["rounds"] == res["sync-easgd"]["rounds"] == STEPS // TAU
        assert res["rank-nodes"]["alpha"] == res["sync-easgd"]["alpha"] == 0.9 / WORLD
        # Two nodes of two: deterministic, the node's ranks alike, the rule followed.
        two = res["2x2"]
        assert torch.equal(two["replica"], res["2x2-again"]["replica"]), rank
        assert torch.equal(two["evaluated"], res["2x2-again"]["evaluated"]), rank
        for key in ("replica", "evaluated"):  # the launcher's layout: the same run, bitwise
            assert torch.equal(two[key], res["2x2-launcher"][key]), (rank, key)
        assert res["2x2-launcher"]["nodes"] == 2
        assert two["nodes"] == 2 and two["alpha"] == 0.9 / 2
        assert _close(two["replica"], xs[rank // 2]), rank
        assert _close(two["evaluated"], center), rank
        assert _close(res["2x2-ring"]["evaluated"], center), rank
    # fp16: rank 1's overflow makes its node skip the step (the node's gradient sum carries
    # it), not the other node (no flag crosses the nodes every step); the rounds go on alike
    assert [int(r["2x2-fp16"]["skipped"]) for r in results] == [1, 1, 0, 0]
    assert {int(r["2x2-fp16"]["rounds"]) for r in results} == {STEPS // TAU}
    assert torch.equal(results[0]["2x2"]["replica"], results[1]["2x2"]["replica"])
    assert torch.equal(results[2]["2x2"]["replica"], results[3]["2x2"]["replica"])
    assert not torch.equal(results[0]["2x2"]["replica"], results[2]["2x2"]["replica"])
    assert all(torch.equal(r["2x2"]["evaluated"], results[0]["2x2"]["evaluated"]) for r in results)
