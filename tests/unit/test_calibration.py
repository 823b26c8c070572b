"""The calibration's arithmetic without processes: interpolation of measured times, auto's
choice (native unless beaten by the margin), the model's predictions, the JSON round trip."""

from __future__ import annotations

import pytest

from tether.comm.collectives import cost
from tether.comm.collectives.chain import Chain
from tether.comm.collectives.hierarchical import Hierarchical
from tether.comm.collectives.ring import ring_all_reduce
from tether.perf.calibration import MARGIN, VERSION, Calibration


def _calibration(**measured: list[tuple[float, float]]) -> Calibration:
    return Calibration(
        world_size=4,
        ranks_per_node=2,
        alpha=1e-4,
        beta=1e-9,
        gamma=1e-10,
        inter_alpha=2e-4,
        inter_beta=8e-9,
        measured={"all_reduce": measured},
    )


def test_measured_times_interpolate_log_log_and_scale_beyond() -> None:
    c = _calibration(native=[(4.0, 1e-4), (4096.0, 1e-3)])
    assert c.measured_time("native", "all_reduce", 1) == 1e-4  # below: the smallest measured
    assert c.measured_time("native", "all_reduce", 128) == pytest.approx(10**-3.5)  # midpoint
    assert c.measured_time("native", "all_reduce", 8192) == pytest.approx(2e-3)  # proportional
    assert c.measured_time("ring", "all_reduce", 4) is None


def test_auto_keeps_native_unless_another_is_faster_by_the_margin() -> None:
    native = [(4.0, 1.0), (4096.0, 1.0)]
    close = [(4.0, 1.0 - MARGIN / 2), (4096.0, 1.0 - MARGIN / 2)]
    clearly = [(4.0, 0.5), (4096.0, 2.0)]  # faster for small sizes only
    c = _calibration(native=native, ring=close, naive=clearly)
    assert c.choose("all_reduce", 4) == "naive"
    assert c.choose("all_reduce", 4096) == "native"  # naive slower there; ring within the margin
    c = _calibration(native=native, ring=close)
    assert c.choose("all_reduce", 64) == "native"
    assert c.predict("auto", "all_reduce", 4) == 1.0
    # beyond the largest timed size only native is chosen (an extrapolation is no evidence)
    c = _calibration(native=native, naive=clearly)
    assert c.choose("all_reduce", 4) == "naive" and c.choose("all_reduce", 8192) == "native"
    # between two timed sizes only with the evidence at both: naive's interpolated time at
    # 16 B is 0.71 (a 29% win) but it loses at 4096 B, so the curves cross somewhere between
    assert c.measured_time("naive", "all_reduce", 16) < 1 - MARGIN
    assert c.choose("all_reduce", 16) == "native"
    both = [(4.0, 0.5), (4096.0, 0.7)]
    c = _calibration(native=native, naive=clearly, ring=both)
    assert c.choose("all_reduce", 4) == "naive"  # the fastest of those that win there
    assert c.choose("all_reduce", 64) == "ring" and c.choose("all_reduce", 4096) == "ring"


def test_predictions_are_the_model_with_two_link_levels() -> None:
    c = _calibration()
    n = 1e6
    assert c.predict("ring", "all_reduce", n) == pytest.approx(
        cost(ring_all_reduce(4), n, c.alpha, c.beta, c.gamma, c.inter)
    )
    assert c.predict("chain", "all_reduce", n) is None  # chain is a broadcast
    assert c.predict("native", "all_reduce", n) is None  # not measured here
    # without measurements auto falls back to the model's fastest
    assert c.choose("all_reduce", n) in ("ring", "halving-doubling", "hierarchical")
    chain = c.instantiate("chain")
    assert isinstance(chain, Chain) and (chain.alpha, chain.beta) == (c.alpha, c.beta)
    hierarchical = c.instantiate("hierarchical")
    assert isinstance(hierarchical, Hierarchical) and hierarchical.ranks_per_node == 2


def test_json_round_trip_and_stale_versions() -> None:
    c = _calibration(native=[(4.0, 1e-4)])
    assert Calibration.from_json(c.to_json()) == c
    with pytest.raises(ValueError, match="another version"):
        Calibration.from_json(c.to_json().replace(f'"version": {VERSION}', '"version": 1'))
