"""The performance model's formulas: collective closed forms against the collectives' own
schedules, the DAG model against hand-computed cases and its invariants, MG-WFBP, the fusion
layout's bucket times, and hardware profiles as validated data."""

from __future__ import annotations

import json
import random

import pytest

from tether.api.perf import predict
from tether.comm.collectives.binomial import binomial_all_reduce
from tether.comm.collectives.halving_doubling import halving_doubling_all_reduce
from tether.comm.collectives.hierarchical import hierarchical_all_reduce
from tether.comm.collectives.naive import naive_all_reduce
from tether.comm.collectives.recursive_doubling import recursive_doubling_all_reduce
from tether.comm.collectives.ring import ring_all_reduce
from tether.comm.collectives.schedule import NodeLinks, cost, shared_core_cost
from tether.errors import TetherError
from tether.perf import dag
from tether.perf.collective_cost import Links, all_reduce_time, best_all_reduce
from tether.perf.profile import built_in_profiles, load_profile, profile_from_dict
from tether.perf.workload import LayerCost, Workload

A, B, G = 3e-5, 1e-9, 2e-10
IA, IB = 4e-4, 6e-9

SCHEDULES = {
    "ring": ring_all_reduce,
    "halving-doubling": halving_doubling_all_reduce,
    "recursive-doubling": recursive_doubling_all_reduce,
    "binomial": binomial_all_reduce,
    "naive": naive_all_reduce,
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_closed_forms_equal_the_schedules_on_one_node(name: str) -> None:
    links = Links(A, B, G, IA, IB, ranks_per_node=64)
    for world in range(2, 17):
        for n in (4.0, 1e5, 3e8):
            expected = cost(SCHEDULES[name](world), n, A, B, G)
            assert all_reduce_time(name, world, n, links) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_shared_core_closed_forms_equal_the_schedules(name: str) -> None:
    for cores in (1, 2, 3, 4, 8, 64):
        for one_way in (None, 7e-5):
            links = Links(A, B, G, IA, IB, 64, shared_cores=cores, one_way_a=one_way)
            for world in range(2, 17):
                for n in (4.0, 1e5, 3e8):
                    schedule = SCHEDULES[name](world)
                    expected = shared_core_cost(schedule, n, A, B, G, cores, one_way)
                    got = all_reduce_time(name, world, n, links)
                    assert got == pytest.approx(expected, rel=1e-12), (cores, world, n)


def test_shared_cores_by_hand() -> None:
    """2 ranks on 2 cores: the ring as on links; naive pays one end of each message, half the
    link's bytes, so it costs the ring's time (what gloo over loopback measures). 4 ranks on 2
    cores: every round of the ring stretches by 2."""
    n = 1e6
    one = Links(A, B, G, IA, IB, ranks_per_node=64)
    shared = Links(A, B, G, IA, IB, ranks_per_node=64, shared_cores=2)
    ring2 = 2 * A + n * B + n / 2 * G
    assert all_reduce_time("ring", 2, n, shared) == pytest.approx(ring2)
    assert all_reduce_time("ring", 2, n, one) == pytest.approx(ring2)
    naive2 = (A + n * B / 2 + n * G) + (A + n * B / 2)
    assert all_reduce_time("naive", 2, n, shared) == pytest.approx(naive2)
    assert all_reduce_time("naive", 2, n, one) == pytest.approx(2 * A + 2 * n * B + n * G)
    ring4 = 2 * (6 * A + 6 / 4 * n * B + 3 / 4 * n * G)
    assert all_reduce_time("ring", 4, n, shared) == pytest.approx(ring4)
    assert all_reduce_time("native", 4, n, shared) == pytest.approx(ring4)
    # a one-way round (the tree's) starts in its own start-up; the ring's rounds keep a
    trees = Links(A, B, G, IA, IB, ranks_per_node=64, shared_cores=2, one_way_a=3 * A)
    assert all_reduce_time("naive", 2, n, trees) == pytest.approx(naive2 + 4 * A)
    assert all_reduce_time("ring", 2, n, trees) == pytest.approx(ring2)
    # the load of training adds to both start-ups
    loaded = Links(A, B, G, IA, IB, 64, a_load=A / 2, shared_cores=2, one_way_a=3 * A)
    assert all_reduce_time("naive", 2, n, loaded) == pytest.approx(naive2 + 4 * A + 2 * A / 2)
    assert all_reduce_time("ring", 2, n, loaded) == pytest.approx(ring2 + 2 * A / 2)
    # across nodes the links price it as before: shared cores are one node's
    two_nodes = Links(A, B, G, IA, IB, ranks_per_node=2, shared_cores=2)
    assert all_reduce_time("ring", 4, n, two_nodes) == all_reduce_time(
        "ring", 4, n, Links(A, B, G, IA, IB, ranks_per_node=2)
    )
    with pytest.raises(ValueError, match="unknown all-reduce algorithm"):
        all_reduce_time("spiral", 4, 1.0, shared)
    with pytest.raises(ValueError, match="cores must be at least 1"):
        shared_core_cost(SCHEDULES["ring"](2), n, A, B, G, 0)


@pytest.mark.parametrize(("world", "per_node"), [(4, 2), (8, 2), (8, 4), (16, 4), (12, 3)])
def test_closed_forms_equal_the_schedules_across_nodes(world: int, per_node: int) -> None:
    links = Links(A, B, G, IA, IB, ranks_per_node=per_node)
    node_links = NodeLinks(per_node, IA, IB)
    for n in (4.0, 1e5, 3e8):
        ring = cost(ring_all_reduce(world), n, A, B, G, node_links)
        assert all_reduce_time("ring", world, n, links) == pytest.approx(ring, rel=1e-12)
        hier = cost(hierarchical_all_reduce(world, per_node), n, A, B, G, node_links)
        assert all_reduce_time("hierarchical", world, n, links) == pytest.approx(hier, rel=1e-12)
    # large messages: the hierarchical algorithm moves 1/G of the bytes across nodes
    assert all_reduce_time("hierarchical", world, 3e8, links) < all_reduce_time(
        "ring", world, 3e8, links
    )
    # A node's link faster than its inside (InfiniBand beside PCIe): a round of the ring still
    # waits for its steps inside the nodes. Before, every round was priced at the node link
    # alone, and two nodes came out faster than one.
    slow_inside = Links(IA, IB, G, A, B, ranks_per_node=per_node)
    for n in (4.0, 1e5, 3e8):
        ring = cost(ring_all_reduce(world), n, IA, IB, G, NodeLinks(per_node, A, B))
        assert all_reduce_time("ring", world, n, slow_inside) == pytest.approx(ring, rel=1e-12)
        one_node = all_reduce_time("ring", per_node, n, slow_inside)
        assert all_reduce_time("ring", world, n, slow_inside) >= one_node


def test_edge_cases_and_the_best_algorithm() -> None:
    links = Links(A, B, G, IA, IB, ranks_per_node=8)
    assert all_reduce_time("ring", 1, 1e6, links) == 0.0
    assert all_reduce_time("native", 8, 1e6, links) == all_reduce_time("ring", 8, 1e6, links)
    small, _ = best_all_reduce(8, 4.0, links)
    large, _ = best_all_reduce(8, 1e9, links)
    assert small == "recursive-doubling"  # log2(P) start-ups instead of 2(P-1)
    assert large in ("ring", "halving-doubling")  # the bandwidth lower bound
    with pytest.raises(ValueError, match="unknown all-reduce algorithm"):
        all_reduce_time("spiral", 4, 1.0, links)


def test_wfbp_by_hand() -> None:
    # 3 layers, forward order; backward runs 3, 2, 1
    t_f, t_b, t_c, t_u = 1.0, [2.0, 1.0, 1.0], [1.0, 3.0, 0.5], 0.5
    # tau_b = [2, 1, 0]; tau_c(3) = 1; tau_c(2) = max(1 + 0.5, 1 + 1) = 2;
    # tau_c(1) = max(2 + 3, 2 + 2) = 5; T = 1 + 5 + 1 + 0.5
    assert dag.comm_starts(t_b, t_c) == [5.0, 2.0, 1.0]
    it = dag.wfbp(t_f, t_b, t_c, t_u)
    assert it.total_s == 7.5
    assert it.compute_s == 5.5 and it.exposed_comm_s == 2.0 and it.comm_s == 4.5
    assert dag.naive(t_f, t_b, t_c, t_u).total_s == 10.0


def test_wfbp_invariants_on_random_cases() -> None:
    rng = random.Random(0)
    for _ in range(300):
        layers = rng.randint(1, 12)
        t_b = [rng.uniform(0, 2) for _ in range(layers)]
        t_c = [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(layers)]
        t_f, t_u = rng.uniform(0, 2), rng.uniform(0, 1)
        total = dag.wfbp(t_f, t_b, t_c, t_u).total_s
        assert t_f + sum(t_b) + t_c[0] + t_u <= total + 1e-12
        assert total <= dag.naive(t_f, t_b, t_c, t_u).total_s + 1e-12
        zero = dag.wfbp(t_f, t_b, [0.0] * layers, t_u)
        assert zero.total_s == pytest.approx(t_f + sum(t_b) + t_u)  # no comm: the compute


def test_mg_wfbp_never_predicts_more_than_wfbp_and_merges_small_layers() -> None:
    rng = random.Random(1)
    alpha, beta = 1e-3, 1e-9

    def comm(n: float) -> float:
        return alpha + n * beta

    for _ in range(200):
        layers = rng.randint(1, 10)
        t_b = [rng.uniform(0, 3e-3) for _ in range(layers)]
        sizes = [rng.choice([400, 4_000, 400_000, 4_000_000]) for _ in range(layers)]
        plain = dag.wfbp(0.01, t_b, [comm(s) for s in sizes], 1e-3).total_s
        merged = dag.mg_wfbp(0.01, t_b, sizes, 1e-3, comm, alpha)
        assert merged.iteration.total_s <= plain + 1e-15
        assert sorted(i for g in merged.groups for i in g) == list(range(layers))
    # ten tiny layers whose backward is far shorter than a start-up: one message
    merged = dag.mg_wfbp(0.01, [1e-6] * 10, [400] * 10, 0.0, comm, alpha)
    assert merged.groups == (tuple(range(10)),)
    assert merged.iteration.total_s == pytest.approx(0.01 + 10e-6 + comm(4000))


def test_bucket_comm_follows_the_fusion_layout() -> None:
    def comm(n: float) -> float:
        return n  # seconds = bytes: the buckets' sizes are visible

    sizes = [(100, 4), (300,), (50, 50)]  # three layers, forward order
    # reverse layout: layer 3 (100 bytes) then layer 2 (300) then layer 1 (104); buckets of 150:
    # [0,150) ends in layer 2, [150,300) in layer 2, [300,450) in layer 1, [450,504) in layer 1
    assert dag.bucket_comm(sizes, 150, comm) == [150 + 54, 150 + 150, 0.0]
    assert dag.bucket_comm(sizes, 1e9, comm) == [504, 0.0, 0.0]  # one bucket: the first layer
    assert dag.bucket_comm(sizes, None, comm) == [104, 300, 100]  # one message per tensor


def test_built_in_profiles_load_and_every_number_has_a_source() -> None:
    names = built_in_profiles()
    for expected in ("vm-2cores", "10gbe-cluster", "10gbe-cpu-cluster", "ib56-cluster",
                     "k80-8gpu-pcie", "p40-cluster"):  # fmt: skip
        assert expected in names
    for name in names:
        profile = load_profile(name)
        data = profile.to_dict()
        assert profile_from_dict(data) == profile  # the JSON form round-trips
        for sourced in (profile.gamma, profile.flops, profile.intra.alpha, profile.inter.beta):
            assert sourced.source.strip()
    # MG-WFBP's fits are of a whole all-reduce on 16 workers, T(n) = a + b n: the ring over 16
    # workers on the profiles' links gives them back (charged per link, they cost 2-30x more)
    fits = {"10gbe-cluster": (9.08e-4, 7.40e-10), "10gbe-cpu-cluster": (9.08e-4, 7.40e-10),
            "ib56-cluster": (2.36e-4, 4.06e-10)}  # fmt: skip
    for name, (a, b) in fits.items():
        inter = load_profile(name).inter
        for n in (4096, 1e8):
            ring = 2 * 15 * inter.alpha.value + 2 * 15 / 16 * n * inter.beta.value
            assert ring == pytest.approx(a + b * n, rel=1e-5), (name, n)


def test_a_profile_missing_a_field_is_a_one_line_error(tmp_path) -> None:
    data = load_profile("ib56-cluster").to_dict()
    del data["inter"]["beta"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TetherError, match=r"missing field 'inter.beta'") as info:
        load_profile(str(path))
    assert "\n" not in str(info.value)
    data = load_profile("ib56-cluster").to_dict()
    data["flops"] = {"value": "fast", "source": "x"}
    with pytest.raises(TetherError, match="'flops' must be a finite number"):
        profile_from_dict(data)
    with pytest.raises(TetherError, match="unknown profile 'nope'"):
        load_profile("nope")
    path.write_text("{not json")
    with pytest.raises(TetherError, match="not valid JSON"):
        load_profile(str(path))


def test_mg_wfbp_takes_the_all_reduces_start_up_for_its_merge_rule() -> None:
    """At 4096 workers a ring all-reduce's fixed cost (2(P-1) latencies) dwarfs the compute:
    MG-WFBP must merge the layers into one message and predict no more than one bucket's WFBP.
    It kept layers apart and predicted twice WFBP's time (LeNet-5 on the p40-cluster profile:
    82.0 ms against 41.0 ms): a layer without parameters between two with (a pooling, an
    activation) stopped its chain of merges, and its rule took one point-to-point latency for
    the all-reduce's start-up."""
    sizes = (624, 0, 9664, 0, 0, 192480, 40656, 3400)  # LeNet-5's layers, forward order (bytes)
    tiny = Workload(  # microseconds of compute per layer
        model="tiny",
        batch_size=64,
        layers=tuple(
            LayerCost(f"l{i}", (b,) if b else (), 1e5, forward_s=1e-6, backward_s=2e-6)
            for i, b in enumerate(sizes)
        ),
        update_s=1e-6,
        measured_on="test",
    )
    pred = predict(tiny, "sync-sgd", 4096, "p40-cluster", bucket_mb=1000, overlap=True)
    assert pred.details["mg_wfbp_messages"] == 1
    assert pred.details["mg_wfbp_s"] <= pred.details["wfbp_s"] * (1 + 1e-9)
