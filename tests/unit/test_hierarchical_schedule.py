"""The hierarchical (two-level) schedules: what they compute for every split of ranks into nodes,
and that they move fewer bytes across nodes than the flat ring (docs/communication.md)."""

from __future__ import annotations

import pytest
import torch

from tether.comm.collectives import NodeLinks, cost, simulate
from tether.comm.collectives.hierarchical import (
    Hierarchical,
    hierarchical_all_reduce,
    hierarchical_broadcast,
    launch_node_size,
)
from tether.comm.collectives.ring import ring_all_reduce
from tether.errors import TetherError

SPLITS = [(p, g) for p in range(1, 10) for g in range(1, p + 1) if p % g == 0]


def _inputs(world: int, n: int) -> list[torch.Tensor]:
    return [torch.arange(n, dtype=torch.float64) * (r + 1) + r for r in range(world)]


@pytest.mark.parametrize(("world", "per_node"), SPLITS)
def test_all_reduce_sums_everywhere_for_every_node_split(world: int, per_node: int) -> None:
    schedule = hierarchical_all_reduce(world, per_node)
    for n in sorted({1, max(world - 1, 1), 7, world * 3 + 1, 100}):
        inputs = _inputs(world, n)
        total = torch.stack(inputs).sum(0)
        assert all(torch.equal(t, total) for t in simulate(schedule, inputs)), (world, per_node, n)


@pytest.mark.parametrize(("world", "per_node"), SPLITS)
def test_broadcast_copies_the_root_for_every_node_split(world: int, per_node: int) -> None:
    for root in {0, world - 1, world // 2}:
        inputs = _inputs(world, 9)
        out = simulate(hierarchical_broadcast(world, per_node, root), inputs)
        assert all(torch.equal(t, inputs[root]) for t in out), (world, per_node, root)


def _inter_node_elements(schedule, n: int, per_node: int) -> list[int]:
    sent = [0] * schedule.world_size
    for step in schedule.steps:
        if step.src // per_node != step.dst // per_node:
            sent[step.src] += schedule.step_elements(step, n)
    return sent


@pytest.mark.parametrize(("nodes", "per_node"), [(2, 2), (2, 4), (3, 2), (4, 2)])
def test_fewer_bytes_cross_nodes_than_with_the_flat_ring(nodes: int, per_node: int) -> None:
    world, n = nodes * per_node, 240_000
    hier = _inter_node_elements(hierarchical_all_reduce(world, per_node), n, per_node)
    flat = _inter_node_elements(ring_all_reduce(world), n, per_node)
    # every rank sends 2(N-1)/N * n/G across nodes; the flat ring's crossing ranks 2(P-1)/P * n
    assert hier == [2 * (nodes - 1) * n // (nodes * per_node)] * world
    assert max(flat) == 2 * (world - 1) * n // world
    # per node (its one link): 2(N-1)/N * n against the flat ring's 2(P-1)/P * n
    for k in range(nodes):
        node = slice(k * per_node, (k + 1) * per_node)
        assert sum(hier[node]) < sum(flat[node])


def test_rounds_and_the_degenerate_splits() -> None:
    # 2(G-1) intra rounds + 2(N-1) inter rounds
    assert hierarchical_all_reduce(8, 4).num_rounds == 2 * 3 + 2 * 1
    # one rank per node is the flat ring; one node is the ring inside it
    for world in (2, 3, 5):
        flat = ring_all_reduce(world)
        for per_node in (1, world):
            hier = hierarchical_all_reduce(world, per_node)
            assert hier.num_rounds == flat.num_rounds
            assert {(s.src, s.dst) for s in hier.steps} == flat.links()


def test_node_membership_errors_and_the_launch_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TetherError, match="--ranks-per-node"):
        hierarchical_all_reduce(6, 4)
    # the node size is an argument: the launcher's layout does not leak in from the environment
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert Hierarchical().nodes_of(4) == 4  # none given: the whole group is one node
    assert Hierarchical(ranks_per_node=2).nodes_of(4) == 2
    assert Hierarchical(ranks_per_node=4).nodes_of(4) == 4
    # the launcher's local world size, where it splits the group into whole nodes
    assert launch_node_size(4, 2) == 2
    assert Hierarchical(ranks_per_node=launch_node_size(4, 2)).nodes_of(4) == 2
    # a group the launch's node size does not divide, or no launcher, is treated as one node
    assert launch_node_size(3, 2) == 3 and launch_node_size(4, None) == 4
    assert launch_node_size(2, 4) == 2 and launch_node_size(4, 0) == 4


def test_cost_prices_inter_node_steps_on_the_shared_node_link() -> None:
    a, b, g, ia, ib, n = 1e-5, 1e-9, 0.0, 1e-4, 8e-9, 4e6
    links = NodeLinks(ranks_per_node=2, alpha=ia, beta=ib)
    # 2 nodes x 2: intra reduce-scatter + all-gather (n/2 each); two inter rounds in which BOTH
    # ranks of a node send n/4 over the node's one link
    expected = 2 * (a + n / 2 * b) + 2 * (ia + 2 * (n / 4) * ib)
    assert cost(hierarchical_all_reduce(4, 2), n, a, b, g, links) == pytest.approx(expected)
    # the flat ring crosses with one rank per node per round: 2(P-1) rounds of n/P each, every
    # round paced by the slow link
    assert cost(ring_all_reduce(4), n, a, b, g, links) == pytest.approx(6 * (ia + n / 4 * ib))
    # without node links both collapse to the one-level closed form
    assert cost(hierarchical_all_reduce(4, 2), n, a, b, g) == pytest.approx(
        2 * (a + n / 2 * b) + 2 * (a + n / 4 * b)
    )
