"""Each method's predicted iteration against a hand-computed case, the compute slowdown of shared
cores, scaling curves, the FLOP path, and timing a user's model layer by layer."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tether.api.perf import predict, predict_scaling, simulate, time_model
from tether.bench.compute_samples import (
    LoopTimes,
    busy_node_slowdown,
    loop_times_from_metrics,
    median_sample,
)
from tether.bench.link_fit import fit_alpha_beta, fit_ring
from tether.errors import TetherError
from tether.perf.collective_cost import Links, all_reduce_time
from tether.perf.profile import profile_from_dict
from tether.perf.scaling import ScalingCutWarning
from tether.perf.workload import LayerCost, Workload

A, B, G = 1e-4, 1e-9, 1e-10


def _profile(cores: int = 0, per_node: int = 64) -> dict:
    def s(v: float) -> dict:
        return {"value": v, "source": "test"}

    return {
        "name": "test",
        "description": "hand-made",
        "ranks_per_node": per_node,
        "cores_per_node": cores,
        "intra": {"alpha": s(A), "beta": s(B)},
        "inter": {"alpha": s(10 * A), "beta": s(10 * B)},
        "gamma": s(G),
        "flops": s(1e9),
    }


PROFILE = profile_from_dict(_profile())
# three layers (forward order): times in seconds, gradients in bytes
WORKLOAD = Workload(
    model="toy",
    batch_size=32,
    layers=(
        LayerCost("a", (400_000, 400), 1e6, forward_s=0.002, backward_s=0.004),
        LayerCost("b", (4_000_000, 4_000), 2e6, forward_s=0.001, backward_s=0.002),
        LayerCost("c", (40_000,), 1e5, forward_s=0.0005, backward_s=0.001),
    ),
    update_s=0.0005,
    measured_on="test",
)
COMPUTE = 0.0035 + 0.007 + 0.0005
MODEL_BYTES = 400_000 + 400 + 4_000_000 + 4_000 + 40_000


def ring(p: int, n: float) -> float:
    return 2 * (p - 1) * A + 2 * (p - 1) / p * n * B + (p - 1) / p * n * G


def test_sync_sgd_naive_per_tensor_by_hand() -> None:
    pred = predict(WORKLOAD, "sync-sgd", 4, PROFILE, bucket_mb=0, overlap=False)
    sizes = (400_000, 400, 4_000_000, 4_000, 40_000)
    assert pred.iteration_s == pytest.approx(COMPUTE + sum(ring(4, n) for n in sizes))
    assert pred.compute_s == pytest.approx(COMPUTE)
    assert pred.exposed_comm_s == pytest.approx(sum(ring(4, n) for n in sizes))
    # overlapped, one bucket per layer or finer: never slower, never below the compute
    wfbp = predict(WORKLOAD, "sync-sgd", 4, PROFILE, bucket_mb=0, overlap=True)
    assert COMPUTE < wfbp.iteration_s < pred.iteration_s
    assert wfbp.details["mg_wfbp_s"] <= wfbp.details["wfbp_s"] + 1e-15
    assert wfbp.details["recommended_s"] <= wfbp.iteration_s + 1e-15
    one = predict(WORKLOAD, "sync-sgd", 1, PROFILE)
    assert one.iteration_s == pytest.approx(COMPUTE) and one.comm_share == 0.0


def test_round_methods_by_hand() -> None:
    t = ring(4, MODEL_BYTES)
    local = predict(WORKLOAD, "local-sgd", 4, PROFILE, tau=4)
    assert local.iteration_s == pytest.approx(COMPUTE + t / 4)
    # sync-easgd: the round (all-reduce + three passes of the elastic move) hides under the next
    # tau steps; with tau = 1 and a slow link it cannot
    hidden = predict(WORKLOAD, "sync-easgd", 4, PROFILE, tau=4)
    assert hidden.iteration_s == pytest.approx(COMPUTE)
    slow = profile_from_dict(
        {
            **_profile(),
            "intra": {
                "alpha": {"value": 0.01, "source": "t"},
                "beta": {"value": 1e-8, "source": "t"},
            },
        }
    )
    exposed = predict(WORKLOAD, "sync-easgd", 4, slow, tau=1)
    round_s = all_reduce_time("ring", 4, MODEL_BYTES, Links(0.01, 1e-8, G, 1e-3, 1e-8, 64))
    round_s += 3 * MODEL_BYTES * G
    assert exposed.iteration_s == pytest.approx(COMPUTE + round_s - COMPUTE)
    no_overlap = predict(WORKLOAD, "sync-easgd", 4, slow, tau=1, overlap=False)
    assert no_overlap.iteration_s == pytest.approx(COMPUTE + round_s)


def test_server_methods_by_hand() -> None:
    m = A + MODEL_BYTES * B
    service = 3 * MODEL_BYTES * G + A
    p, tau = 8, 4
    original = predict(WORKLOAD, "original-easgd", p, PROFILE, tau=tau)
    cycle = max(tau * COMPUTE + 2 * m + service, p * (2 * m + service))
    assert original.iteration_s == pytest.approx(cycle / tau, rel=1e-9)
    service_sgd = 2 * MODEL_BYTES * G + A
    async_sgd = predict(WORKLOAD, "async-sgd", p, PROFILE)
    # steady state: the server bounds the rate at one update per service time
    per_step = max(COMPUTE + 2 * m + service_sgd, p * service_sgd)
    assert async_sgd.iteration_s == pytest.approx(per_step, rel=1e-9)
    hogwild = predict(WORKLOAD, "hogwild-sgd", p, PROFILE)
    assert hogwild.iteration_s == pytest.approx(COMPUTE + 2 * MODEL_BYTES * G, rel=1e-9)


def test_shared_cores_slow_the_compute_and_stop_the_overlap() -> None:
    two_cores = profile_from_dict(_profile(cores=2))
    four = predict(WORKLOAD, "local-sgd", 4, two_cores, tau=4)
    assert four.details["compute_slowdown"] == 2.0
    assert four.compute_s == pytest.approx(2 * COMPUTE)
    # a parameter server takes of a core what it is busy (its utilisation), not a whole one
    server = predict(WORKLOAD, "async-sgd", 4, two_cores)
    busy = server.details["server_service_s"] * 4 / server.details["closed_form_s"]
    assert 0 < busy < 1
    assert server.details["compute_slowdown"] == pytest.approx((4 + busy) / 2, rel=1e-6)
    # a saturated server (the rate bound by its service time) takes a whole core
    slow_server = profile_from_dict({**_profile(cores=2), "gamma": {"value": 1e-7, "source": "t"}})
    saturated = predict(WORKLOAD, "async-sgd", 4, slow_server)
    assert saturated.details["compute_slowdown"] == pytest.approx(2.5)
    easgd = predict(WORKLOAD, "sync-easgd", 4, two_cores, tau=4)
    assert easgd.details["overlap_effective"] is False
    assert easgd.exposed_comm_s > 0


def test_scaling_curves() -> None:
    counts = [1, 2, 4, 8, 16, 32, 64, 128]
    weak = predict_scaling(WORKLOAD, "sync-sgd", PROFILE, counts)
    assert weak[0]["efficiency"] == pytest.approx(1.0)
    assert all(r["batch_size"] == 32 for r in weak)
    effs = [r["efficiency"] for r in weak]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(effs))
    with pytest.warns(ScalingCutWarning, match="strong scaling ends at 32 workers: the global"):
        strong = predict_scaling(WORKLOAD, "sync-sgd", PROFILE, counts, strong=True)
    assert [r["batch_size"] for r in strong][:3] == [32, 16, 8]
    # the global batch of 32 has a sample for each of 32 workers, no more: the curve ends there
    assert [r["workers"] for r in strong] == [1, 2, 4, 8, 16, 32] and strong[-1]["batch_size"] == 1
    assert strong[-1]["efficiency"] < weak[5]["efficiency"]  # less compute to hide behind
    # 3 workers share 32 samples as 11, 11, 10: the largest share sets the step, 32 are done
    (three,) = predict_scaling(WORKLOAD, "sync-sgd", PROFILE, [1, 3], strong=True)[1:]
    step = predict(WORKLOAD.at_batch(11), "sync-sgd", 3, PROFILE).iteration_s
    assert (three["batch_size"], three["samples_per_s"]) == (11, pytest.approx(32 / step))
    with pytest.raises(TetherError, match="unknown setting"):
        predict(WORKLOAD, "sync-sgd", 2, PROFILE, bucket=3)
    with pytest.raises(TetherError, match="no prediction for method"):
        predict(WORKLOAD, "sync-magic", 2, PROFILE)


def test_a_server_nodes_link_bounds_the_workers_on_other_nodes() -> None:
    # Before, the closed form gave each worker's messages a link of their own: hogwild-easgd's
    # weak scaling to 4096 workers came out at 100% efficiency. Now every exchange of a worker
    # on another node than the server's carries the model in and out over the server node's
    # one link (here 10 B per byte), which bounds the rate.
    eight_per_node = profile_from_dict(_profile(per_node=8))
    for method, tau in (("async-sgd", 1), ("async-easgd", 4), ("hogwild-easgd", 4)):
        pred = predict(WORKLOAD, method, 64, eight_per_node, tau=tau)
        floor = (64 - 8) * MODEL_BYTES * 10 * B / tau
        assert pred.details["server_link_floor_s"] == pytest.approx(floor, rel=1e-12)
        assert pred.iteration_s >= floor
        assert (
            predict(WORKLOAD, method, 8, eight_per_node, tau=tau).details["server_link_floor_s"]
            == 0
        )  # every worker on the server's node
    curve = predict_scaling(WORKLOAD, "hogwild-easgd", eight_per_node, [1, 64, 4096], tau=4)
    assert curve[-1]["efficiency"] < 0.05


def test_hogwild_sgd_is_predicted_on_one_node_only() -> None:
    eight_per_node = profile_from_dict(_profile(per_node=8))
    with pytest.raises(
        TetherError,
        match=r"^hogwild-sgd shares its weights in one node's memory: "
        r"at most 8 workers on test \(8 ranks per node, ranks_per_node\), got workers=16",
    ):
        predict(WORKLOAD, "hogwild-sgd", 16, eight_per_node)
    with pytest.warns(ScalingCutWarning, match="hogwild-sgd's curve ends at 8 workers"):
        curve = predict_scaling(WORKLOAD, "hogwild-sgd", eight_per_node, [1, 2, 4, 8, 16, 32])
    assert [row["workers"] for row in curve] == [1, 2, 4, 8]
    with pytest.raises(TetherError, match=r"^workers must be a list of worker counts"):
        predict_scaling(WORKLOAD, "sync-sgd", eight_per_node, 8)  # type: ignore[arg-type]


def test_counted_flops_predict_on_another_profile() -> None:
    other = profile_from_dict({**_profile(), "name": "elsewhere"})
    pred = predict(WORKLOAD, "sync-sgd", 1, other)
    flops = 1e6 + 2e6 + 1e5
    update = 3 * MODEL_BYTES * G
    assert pred.iteration_s == pytest.approx(3 * flops / 1e9 + update)
    doubled = predict(WORKLOAD.at_batch(64), "sync-sgd", 1, other)
    assert doubled.compute_s - doubled.update_s == pytest.approx(2 * (pred.compute_s - update))


def test_time_model_measures_a_user_model() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    x, y = torch.randn(16, 20), torch.randint(0, 3, (16,))
    workload = time_model(net, x, y, F.cross_entropy, name="mlp", repeats=3)
    names = [layer.name for layer in workload.layers]
    assert names == ["0", "2", "(other)"]
    assert workload.layers[0].tensor_bytes == (20 * 64 * 4, 64 * 4)
    assert workload.layers[0].forward_flops == 2 * 16 * 20 * 64  # torch's count of the matmul
    assert workload.layers[1].forward_flops == 2 * 16 * 64 * 3
    assert all(layer.forward_s >= 0 and layer.backward_s >= 0 for layer in workload.layers)
    assert workload.layers[0].forward_s > 0 and workload.update_s > 0
    assert workload.batch_size == 16
    back = Workload.from_dict(workload.to_dict())
    assert back == workload
    with pytest.raises(TetherError, match=r"^model \(ReLU\) has no trainable parameters"):
        time_model(nn.ReLU(), x, y, F.cross_entropy)  # was torch's "empty parameter list"


class Attention(nn.Module):
    """nn.MultiheadAttention uses its out_proj's weight without calling out_proj's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.attend = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attend(x, x, x)[0].mean(1))


class Scaled(nn.Module):
    """A block with a parameter of its own and a layer inside it, applied twice."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(16))
        self.inner = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.gain


class TiedPair(nn.Module):
    """Inputs (x, z) in one tuple; an embedding whose weight is also the output layer's."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.block = Scaled()
        self.out = nn.Linear(16, 100, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens, extra = inputs
        h = self.block(self.block(self.embed(tokens).mean(1) + extra))
        return self.out(h)


def test_time_model_takes_attention_tied_weights_nested_layers_and_tuple_inputs() -> None:
    # Before: nn.MultiheadAttention failed the timing ("no median for empty data": out_proj's
    # forward never runs); a tied weight was counted twice; a block with a layer inside counted
    # that layer's FLOPs twice; a tuple of inputs was taken for a batch of 1.
    torch.manual_seed(0)
    x, y = torch.randn(8, 5, 16), torch.randint(0, 3, (8,))
    workload = time_model(Attention(), x, y, F.cross_entropy, repeats=2)
    by_name = {layer.name: layer for layer in workload.layers}
    names = [layer.name for layer in workload.layers]
    assert names == ["attend", "attend.out_proj", "head", "(other)"]  # out_proj: its parent's
    assert by_name["attend.out_proj"].forward_s == 0  # its time and FLOPs are its parent's
    assert by_name["attend.out_proj"].forward_flops == 0
    assert by_name["attend"].forward_flops >= 2 * 8 * 5 * 16 * 16 * 4  # q, k, v and out
    assert by_name["attend.out_proj"].tensor_bytes == (16 * 16 * 4, 16 * 4)
    assert workload.batch_size == 8

    tokens, extra = torch.randint(0, 100, (8, 7)), torch.randn(8, 16)
    net = TiedPair()
    workload = time_model(net, (tokens, extra), torch.randint(0, 100, (8,)), F.cross_entropy)
    assert workload.batch_size == 8
    unique = sum(p.numel() * p.element_size() for p in net.parameters())  # counted once
    assert workload.parameters_bytes == unique
    by_name = {layer.name: layer for layer in workload.layers}
    assert "out" not in by_name  # its only weight is the embedding's
    assert by_name["block.inner"].forward_flops == 2 * (2 * 8 * 16 * 16)  # called twice
    assert by_name["block"].forward_flops < by_name["block.inner"].forward_flops  # its own part
    counted = FlopCounterMode(display=False)
    with counted, torch.no_grad():
        net((tokens, extra))
    assert workload.forward_flops == counted.get_total_flops()  # nothing counted twice
    # the layers in the order the forward calls them, not as declared (backward's order)
    declared_last_first = nn.Sequential()
    declared_last_first.add_module("head", nn.Linear(8, 3))
    declared_last_first.add_module("body", nn.Linear(4, 8))
    declared_last_first.forward = lambda x: declared_last_first.head(declared_last_first.body(x))  # type: ignore[method-assign]
    workload = time_model(declared_last_first, torch.randn(8, 4), y, F.cross_entropy, repeats=2)
    assert [layer.name for layer in workload.layers] == ["body", "head", "(other)"]


@pytest.mark.filterwarnings("ignore:Using a target size")  # torch's, before the shapes fail
def test_a_timing_that_fails_names_what_does_not_fit() -> None:
    # Before, a model that did not take the data's inputs was blamed on the loss.
    net = nn.Linear(30, 3)
    with pytest.raises(
        TetherError,
        match=r"^timing net's training step failed: the model does "
        r"not take the data's inputs \(shape \[4, 7\]\): RuntimeError: mat1",
    ):
        time_model(net, torch.randn(4, 7), torch.zeros(4, dtype=torch.long), F.cross_entropy,
                   name="net", repeats=1)  # fmt: skip
    with pytest.raises(
        TetherError,
        match=r"does the loss fit the model's outputs \(shape "
        r"\[4, 3\]\) and the data's targets \(shape \[4, 5\]\)\?",
    ):
        time_model(net, torch.randn(4, 30), torch.randn(4, 5), F.mse_loss, repeats=1)
    # a classifier given a regression loss by name (as tether.fit takes it): the hint names
    # the loss the targets want, not the one given (it said "--loss mse" to a user of mse)
    with pytest.raises(TetherError, match=r"class-index targets take a classification loss"):
        time_model(net, torch.randn(4, 30), torch.zeros(4, dtype=torch.long), "mse", repeats=1)
    # a loss of the targets' kind that fails for another reason gets no advice to switch to it
    for loss, targets in ((F.cross_entropy, torch.full((4,), 16)), (F.mse_loss, torch.randn(4))):
        with pytest.raises(TetherError) as refused:
            time_model(net, torch.randn(4, 30), targets, loss, repeats=1)
        assert "takes a" not in str(refused.value), refused.value
    with pytest.raises(TetherError, match=r"a regression takes a regression loss: --loss mse"):
        time_model(net, torch.randn(4, 30), torch.randn(4, 7), F.cross_entropy, repeats=1)
    regression = time_model(nn.Linear(30, 1), torch.randn(4, 30), torch.randn(4), "mse", repeats=1)
    assert regression.batch_size == 4
    # a batch of none made a workload of batch 0, which predicted 0 samples/s without a word
    with pytest.raises(TetherError, match=r"^inputs hold no sample"):
        time_model(net, torch.randn(0, 30), torch.zeros(0, dtype=torch.long), F.cross_entropy)


def test_a_measured_server_wire_prices_the_server_messages() -> None:
    """With ``server_wire`` in the profile a server method's push and reply cost its alpha and
    beta, not the collectives' link; the collective methods are unchanged; it survives the
    profile's JSON."""
    wire_a, wire_b = 3 * A, 2 * B
    data = _profile()
    data["server_wire"] = {
        "alpha": {"value": wire_a, "source": "t"},
        "beta": {"value": wire_b, "source": "t"},
    }
    wired = profile_from_dict(data)
    assert profile_from_dict(wired.to_dict()) == wired
    assert "server_wire" not in PROFILE.to_dict()
    p = 8
    m = wire_a + MODEL_BYTES * wire_b
    service = 2 * MODEL_BYTES * G + A
    per_step = max(COMPUTE + 2 * m + service, p * service)
    assert predict(WORKLOAD, "async-sgd", p, wired).iteration_s == pytest.approx(per_step)
    assert predict(WORKLOAD, "async-sgd", p, wired).iteration_s != pytest.approx(
        predict(WORKLOAD, "async-sgd", p, PROFILE).iteration_s
    )
    for method in ("sync-sgd", "sync-easgd", "local-sgd"):
        assert predict(WORKLOAD, method, p, wired).iteration_s == pytest.approx(
            predict(WORKLOAD, method, p, PROFILE).iteration_s
        )


def test_the_link_fits_recover_alpha_and_beta() -> None:
    """Exact points of ``t = m*a + k*n*b`` give back a and b: the ring fit (all-reduce) and the
    round-trip fit (the server's wire: two messages of n bytes)."""
    sizes = [4096.0, 65536.0, 1 << 20, 1 << 24]
    for world in (2, 4):
        ring_points = [(n, 2 * (world - 1) * A + 2 * (world - 1) / world * n * B) for n in sizes]
        assert fit_ring(ring_points, world) == pytest.approx((A, B), rel=1e-6)
    trips = [(n, 2 * (A + n * B)) for n in sizes]
    assert fit_alpha_beta(trips, messages=2, bytes_factor=2) == pytest.approx((A, B), rel=1e-6)
    with pytest.raises(TetherError, match="two timed sizes"):
        fit_alpha_beta(trips[:1], messages=2, bytes_factor=2)


def test_several_measurements_of_the_links_fit_each_sizes_median() -> None:
    """The ring is fitted to each size's median time over the measurements (one slow spell does
    not set the profile); measurements of different sizes do not combine."""
    from tether.bench.calibrate import LinkFit, median_links

    def fit(small: float, large: float, gamma: float) -> LinkFit:
        points = [(4096.0, small), (1048576.0, large)]
        return LinkFit(*fit_ring(points, 2), gamma, 2, points, "now")

    combined = median_links(
        [fit(1e-3, 9e-3, 3e-10), fit(5e-3, 2e-3, 1e-10), fit(2e-3, 4e-3, 2e-10)]
    )
    assert combined.points == [(4096.0, 2e-3), (1048576.0, 4e-3)]
    assert (combined.alpha, combined.beta) == pytest.approx(
        fit_ring([(4096.0, 2e-3), (1048576.0, 4e-3)], 2)
    )
    assert combined.gamma == 2e-10 and combined.measurements == 3
    assert median_links([fit(1e-3, 9e-3, 3e-10)]).measurements == 1
    other = LinkFit(1e-4, 1e-9, 1e-10, 2, [(8192.0, 1e-3), (1048576.0, 2e-3)], "now")
    with pytest.raises(TetherError, match="different sizes"):
        median_links([fit(1e-3, 9e-3, 3e-10), other])
    with pytest.raises(TetherError, match="no measurement"):
        median_links([])


def test_the_calibration_keeps_the_timing_of_median_speed() -> None:
    """Of several timings of the model's step, calibrate keeps the median one whole (its layers
    together), so one timing in a fast or slow spell of the machine does not set the profile."""
    from dataclasses import replace

    samples = [(replace(WORKLOAD, data_s=s), s) for s in (0.030, 0.010, 0.050, 0.020, 0.040)]
    workload, seconds = median_sample(samples)
    assert seconds == 0.030 and workload.data_s == 0.030
    assert median_sample(samples[:2])[1] == 0.010  # an even count: the lower middle one
    with pytest.raises(TetherError, match="no timing"):
        median_sample([])


def test_a_busy_node_slows_workers_on_cores_of_their_own() -> None:
    """The profile's measured ``busy_node_slowdown`` applies in full when every core runs a
    worker, in proportion to the other cores in use before that, on top of core sharing; it does
    not stop the overlap (no core is shared)."""
    data = {**_profile(cores=4), "busy_node_slowdown": {"value": 1.3, "source": "test"}}
    busy, plain = profile_from_dict(data), profile_from_dict(_profile(cores=4))
    alone = predict(WORKLOAD, "local-sgd", 1, busy, tau=4)
    assert alone.iteration_s == pytest.approx(predict(WORKLOAD, "local-sgd", 1, plain).iteration_s)
    four = predict(WORKLOAD, "local-sgd", 4, busy, tau=4)
    assert four.details["neighbour_slowdown"] == pytest.approx(1.3)
    assert four.compute_s == pytest.approx(1.3 * COMPUTE)
    two = predict(WORKLOAD, "local-sgd", 2, busy, tau=4)  # one of the three other cores busy
    assert two.details["neighbour_slowdown"] == pytest.approx(1.1)
    eight = predict(WORKLOAD, "local-sgd", 8, busy, tau=4)  # two workers a core, all cores busy
    assert eight.details["compute_slowdown"] == pytest.approx(2 * 1.3)
    assert predict(WORKLOAD, "sync-easgd", 4, busy, tau=4).details["overlap_effective"] is True
    assert profile_from_dict(busy.to_dict()).busy_node_slowdown == busy.busy_node_slowdown
    with pytest.raises(TetherError, match="'busy_node_slowdown' must be >= 1"):
        profile_from_dict({**data, "busy_node_slowdown": {"value": 0.8, "source": "t"}})


def test_the_busy_node_slowdown_is_the_median_of_paired_samples() -> None:
    """Each busy-node sample is divided by the one-worker sample taken just before it (the
    machine's drift cancels in a pair); the median of the ratios, at least 1."""
    measured = busy_node_slowdown([0.010, 0.020, 0.010], [0.012, 0.030, 0.011], 2, "now")
    assert measured.value == pytest.approx(1.2)  # ratios 1.2, 1.5, 1.1
    assert "median of 3 pairs (1.100-1.500)" in measured.source
    assert busy_node_slowdown([0.010], [0.009], 2, "now").value == 1.0  # noise, not a speed-up


def test_the_loop_is_timed_between_two_steps_of_the_metrics() -> None:
    """The training clock's difference between the two steps over their distance, and the mean
    compute of the steps after the first; evaluation lines (no loss) are skipped, and metrics
    without one of the steps are one line, not a KeyError."""
    import json

    lines = [{"step": s, "loss": 1.0, "time_s": 0.5 + 0.02 * s, "compute_s": 0.01 * s}
             for s in range(1, 7)]  # fmt: skip
    lines.append({"step": 6, "time_s": 9.0, "accuracy": 0.5})  # the final evaluation
    metrics = "\n".join(json.dumps(line) for line in lines)
    times = loop_times_from_metrics(metrics, 2, 6)
    assert times.step_s == pytest.approx(0.02)
    assert times.compute_s == pytest.approx(0.01 * (3 + 4 + 5 + 6) / 4)
    with pytest.raises(TetherError, match="lack step 2 or 9"):
        loop_times_from_metrics(metrics, 2, 9)
    # an asynchronous run: the server's lines, a global step and each worker's own; worker 1's
    # local steps take 20 ms, worker 2's 30 ms (the first worker's are timed)
    served = [
        {"step": 0, "worker": w, "worker_step": k, "loss": 1.0, "time_s": k * (0.01 + 0.01 * w)}
        for k in range(1, 7)
        for w in (2, 1)
    ]
    metrics = "\n".join(json.dumps(line) for line in served)
    assert loop_times_from_metrics(metrics, 2, 6) == LoopTimes(pytest.approx(0.02), 0.0)


def test_a_server_node_is_bound_by_its_cpu_work() -> None:
    """On a node with fewer cores than processes, a server method's rate cannot exceed what the
    cores do: per step, every local worker's compute plus, per exchange, the server's apply and
    both ends of the push and the reply (4 message times on loopback). Here that bound is above
    the closed form, so it is the prediction; with cores to spare, or across nodes (the network
    carries the messages), the closed form stands."""
    two_cores = profile_from_dict(_profile(cores=2))
    m = A + MODEL_BYTES * B
    service = 2 * MODEL_BYTES * G + A
    bound = predict(WORKLOAD, "async-sgd", 4, two_cores)
    floor = (4 * COMPUTE + 4 * (service + 4 * m)) / 2
    assert bound.details["node_cpu_floor_s"] == pytest.approx(floor, rel=1e-9)
    assert bound.details["closed_form_s"] < floor
    assert bound.iteration_s == pytest.approx(floor, rel=1e-9)
    # original-easgd exchanges every tau steps: a quarter of the exchanges' work per step
    tau = 4
    easgd = predict(WORKLOAD, "original-easgd", 4, two_cores, tau=tau)
    easgd_service = 3 * MODEL_BYTES * G + A
    expected = (4 * COMPUTE + 4 / tau * (easgd_service + 4 * m)) / 2
    assert easgd.details["node_cpu_floor_s"] == pytest.approx(expected, rel=1e-9)
    # cores to spare: the bound is below the closed form, which stands
    many = predict(WORKLOAD, "async-sgd", 4, profile_from_dict(_profile(cores=16)))
    assert many.details["node_cpu_floor_s"] < many.details["closed_form_s"]
    assert many.iteration_s == many.details["closed_form_s"]
    # hogwild-sgd shares weights in memory: no messages, only compute and the apply
    hogwild = predict(WORKLOAD, "hogwild-sgd", 4, two_cores)
    assert hogwild.details["node_cpu_floor_s"] == pytest.approx(
        (4 * COMPUTE + 4 * 2 * MODEL_BYTES * G) / 2, rel=1e-9
    )
    # no core count (a GPU profile): no bound
    assert predict(WORKLOAD, "async-sgd", 4, PROFILE).details["node_cpu_floor_s"] == 0.0
    # across nodes the messages are the network's: only compute and the server's apply count
    apart = predict(WORKLOAD, "async-sgd", 4, profile_from_dict(_profile(cores=2, per_node=2)))
    assert apart.details["node_cpu_floor_s"] == pytest.approx((2 * COMPUTE + 4 * service) / 2)


def test_settings_a_run_would_refuse_are_one_line_and_auto_is_the_fastest() -> None:
    for bucket in (-1.0, float("nan"), float("inf")):  # -1 looped forever, nan: a traceback
        with pytest.raises(TetherError, match="bucket_mb must be >= 0 and finite"):
            predict(WORKLOAD, "sync-sgd", 4, PROFILE, bucket_mb=bucket)
    # a count of another type was a TypeError deep inside or silently cut; 0 threads predicted
    # a worker that uses no core
    for workers, settings, message in (
        ("4", {}, "workers must be a whole number, got '4'"),
        (4, {"tau": 2.5}, "tau must be a whole number, got 2.5"),
        (4, {"threads_per_worker": -1}, "threads_per_worker must be >= 1, got -1"),
    ):
        with pytest.raises(TetherError, match=message):
            predict(WORKLOAD, "sync-sgd", workers, PROFILE, **settings)
    with pytest.raises(TetherError, match="list of whole numbers >= 1, got"):
        predict_scaling(WORKLOAD, "sync-sgd", PROFILE, ["1", "2"])
    with pytest.raises(TetherError, match="repeats must be at least 1, got 0"):
        time_model(nn.Linear(2, 2), torch.zeros(4, 2), torch.zeros(4, 2), F.mse_loss, repeats=0)
    with pytest.raises(TetherError, match="unknown all-reduce 'bogus': one of native, auto, ring"):
        predict(WORKLOAD, "sync-sgd", 4, PROFILE, allreduce="bogus")
    with pytest.raises(TetherError, match="ranks_per_node must be >= 0"):
        predict(WORKLOAD, "sync-sgd", 4, PROFILE, ranks_per_node=-1)
    # tether train's "auto" picks the fastest schedule for each size: priced as the fastest
    links = Links(a=A, b=B, g=G, inter_a=A, inter_b=B, ranks_per_node=8)
    times = [all_reduce_time(name, 6, 1e6, links) for name in ("ring", "naive", "binomial")]
    assert all_reduce_time("auto", 6, 1e6, links) <= min(times)


def test_the_api_takes_the_methods_own_tau_as_the_command_line_does() -> None:
    # local-sgd averages every 4 steps by default: the API assumed every step (4x the cost)
    default = predict(WORKLOAD, "local-sgd", 4, PROFILE)
    assert default.iteration_s == predict(WORKLOAD, "local-sgd", 4, PROFILE, tau=4).iteration_s
    assert default.iteration_s < predict(WORKLOAD, "local-sgd", 4, PROFILE, tau=1).iteration_s


def test_two_level_easgd_counts_its_node_all_reduce_as_communication() -> None:
    # 2 nodes of 2, no overlap: a local step is compute plus the node's all-reduce, which is
    # communication, not compute
    two = predict(WORKLOAD, "two-level-easgd", 4, PROFILE, ranks_per_node=2, overlap=False)
    node = predict(WORKLOAD, "sync-sgd", 2, PROFILE, ranks_per_node=2, overlap=False)
    assert two.compute_s == pytest.approx(COMPUTE)
    assert two.exposed_comm_s >= node.iteration_s - COMPUTE > 0


def test_python_predicts_at_another_batch_and_names_a_tau_that_changes_nothing() -> None:
    """As ``tether predict`` does (--batch-size, and its warning about --tau): the Python
    functions refused batch_size and took a tau for sync-sgd or hogwild-sgd without a word."""
    net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    workload = time_model(net, torch.randn(16, 20), torch.randint(0, 3, (16,)), F.cross_entropy)
    at_64 = predict(workload, "sync-sgd", 2, batch_size=64)
    assert at_64.compute_s == predict(workload.at_batch(64), "sync-sgd", 2).compute_s
    assert at_64.compute_s > predict(workload, "sync-sgd", 2).compute_s
    (row,) = predict_scaling(workload, "sync-sgd", workers=[1], batch_size=32)
    assert row["batch_size"] == 32
    with pytest.raises(TetherError, match=r"^batch_size must be at least 1, got 0$"):
        predict(workload, "sync-sgd", 2, batch_size=0)
    with pytest.warns(UserWarning, match=r"^tau has no effect on sync-sgd \(each exchanges"):
        predict(workload, "sync-sgd", 2, tau=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict(workload, "sync-easgd", 2, tau=4)  # rounds of 4: it changes something
    with pytest.raises(TetherError, match=r"^tau must be at least 1, got 0$"):
        predict(workload, "sync-sgd", 2, tau=0)  # checked, even where it would change nothing
    with pytest.warns(UserWarning, match="^tau has no effect on hogwild-sgd"):
        simulate("hogwild-sgd", 4, 10, 0.01, tau=4)
