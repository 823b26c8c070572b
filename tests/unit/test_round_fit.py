"""The round cost fitted to a calibration's timed algorithms: it recovers the numbers that made
the times, keeps every start-up non-negative, and is what a shared-core calibration predicts
with."""

from __future__ import annotations

import os

import pytest
import torch

from tether.comm.calibration.measure import node_cores
from tether.comm.calibration.model import Calibration
from tether.comm.calibration.round_fit import FITTED, RoundCost, fit_round_cost
from tether.comm.collectives.registry import COLLECTIVES
from tether.comm.collectives.schedule import cost, shared_core_cost

SIZES = (16.0, 256.0, 2048.0, 16384.0, 131072.0, 1048576.0, 8388608.0)
GAMMA = 2e-10


def _times(world: int, cores: int, rounds: RoundCost) -> dict[str, list[tuple[float, float]]]:
    """Every fitted algorithm's time at every size as the shared-core model prices it."""
    measured = {}
    for name in FITTED:
        points = []
        for n in SIZES:
            schedule = COLLECTIVES.get(name).schedule(world, int(n) // 4, "all_reduce")
            a, a1, b = rounds.alpha, rounds.one_way_alpha, rounds.beta
            points.append((n, shared_core_cost(schedule, n, a, b, GAMMA, cores, a1)))
        measured[name] = points
    return measured


@pytest.mark.parametrize(("world", "cores"), [(2, 2), (4, 2), (3, 8)])
def test_the_fit_recovers_the_numbers_that_made_the_times(world: int, cores: int) -> None:
    truth = RoundCost(alpha=5e-4, one_way_alpha=2e-4, beta=6e-10)
    fitted = fit_round_cost(_times(world, cores, truth), world, GAMMA, cores)
    assert fitted is not None
    assert fitted.alpha == pytest.approx(truth.alpha, rel=1e-3)
    assert fitted.one_way_alpha == pytest.approx(truth.one_way_alpha, rel=1e-3)
    assert fitted.beta == pytest.approx(truth.beta, rel=1e-3)


def test_a_start_up_is_never_negative_and_too_few_times_fit_nothing() -> None:
    # one-way rounds measured faster than their bytes alone: their start-up is 0, not negative
    measured = _times(4, 2, RoundCost(alpha=5e-4, one_way_alpha=0.0, beta=6e-10))
    measured["naive"] = [(n, t * 0.7) for n, t in measured["naive"]]
    measured["binomial"] = [(n, t * 0.7) for n, t in measured["binomial"]]
    fitted = fit_round_cost(measured, 4, GAMMA, 2)
    assert fitted is not None and fitted.one_way_alpha == 0.0 and fitted.alpha > 0
    assert fit_round_cost({"ring": [(1024.0, 1e-3), (4096.0, 2e-3)]}, 4, GAMMA, 2) is None
    # below one element per rank a chunked schedule moves less than it says: not fitted on
    tiny = {name: [(4.0, 1e-3)] * 5 for name in FITTED}
    assert fit_round_cost(tiny, 4, GAMMA, 2) is None


def test_a_shared_core_calibration_predicts_with_the_fitted_rounds() -> None:
    truth = RoundCost(alpha=5e-4, one_way_alpha=2e-4, beta=6e-10)
    fields = dict(world_size=4, ranks_per_node=4, alpha=1e-4, beta=1e-9, gamma=GAMMA)
    measured = {"all_reduce": _times(4, 2, truth)}
    shared = Calibration(**fields, inter_alpha=1e-4, inter_beta=1e-9, cores=2, measured=measured)
    links = Calibration(**fields, inter_alpha=1e-4, inter_beta=1e-9, measured=measured)
    n = 3e5
    naive = COLLECTIVES.get("naive").schedule(4, int(n) // 4, "all_reduce")
    assert shared.predict("naive", "all_reduce", n) == pytest.approx(
        shared_core_cost(naive, n, truth.alpha, truth.beta, GAMMA, 2, truth.one_way_alpha),
        rel=1e-3,
    )
    assert links.round_cost is None  # no cores: the ping-pong's single-port cost
    assert links.predict("naive", "all_reduce", n) == pytest.approx(
        cost(naive, n, 1e-4, 1e-9, GAMMA)
    )
    report = shared.round_cost_json()
    assert report is not None and report["cores"] == 2
    assert report["alpha"] == pytest.approx(truth.alpha, rel=1e-3)
    assert Calibration.from_json(shared.to_json()) == shared


class _Alone:
    """A group of one rank: all-reduce leaves the tensor as it is."""

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        assert op == "max"


class _WithAnother(_Alone):
    """A group whose other rank may run on one more CPU, past this one's."""

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        super().all_reduce(tensor, op)
        tensor[-1] = max(float(tensor[-1]), 1.0)


def test_node_cores_counts_the_union_of_the_ranks_affinities() -> None:
    mine = len(os.sched_getaffinity(0))
    assert node_cores(_Alone()) == mine  # type: ignore[arg-type]
    assert node_cores(_WithAnother()) == mine + 1  # type: ignore[arg-type]
