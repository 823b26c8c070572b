"""The calibration's arithmetic without processes: interpolation of measured times, auto's
choice (native unless beaten by the margin), the model's predictions, the JSON round trip."""

from __future__ import annotations

import math
import socket
import statistics
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tether.comm.calibration.cache import cache_path, load_or_calibrate
from tether.comm.calibration.model import VERSION, Calibration
from tether.comm.calibration.rounds import rotated
from tether.comm.calibration.timed_algorithms import (
    MARGIN,
    MAX_ROUNDS,
    MIN_ROUNDS,
    SIGN_TEST_LEVEL,
    beats_clearly,
    contenders,
    timed_sizes,
    wins_needed,
)
from tether.comm.collectives import cost
from tether.comm.collectives.auto import Auto
from tether.comm.collectives.chain import Chain
from tether.comm.collectives.hierarchical import Hierarchical
from tether.comm.collectives.ring import ring_all_reduce
from tether.errors import TetherError
from tether.launch import affinity


def _calibration(
    clear_wins: dict[str, list[float]] | None = None, **measured: list[tuple[float, float]]
) -> Calibration:
    return Calibration(
        world_size=4,
        ranks_per_node=2,
        alpha=1e-4,
        beta=1e-9,
        gamma=1e-10,
        inter_alpha=2e-4,
        inter_beta=8e-9,
        measured={"all_reduce": measured},
        clear_wins={"all_reduce": clear_wins or {}},
    )


def test_measured_times_interpolate_log_log_and_scale_beyond() -> None:
    c = _calibration(native=[(4.0, 1e-4), (4096.0, 1e-3)])
    assert c.measured_time("native", "all_reduce", 1) == 1e-4  # below: the smallest measured
    assert c.measured_time("native", "all_reduce", 128) == pytest.approx(10**-3.5)  # midpoint
    assert c.measured_time("native", "all_reduce", 8192) == pytest.approx(2e-3)  # proportional
    assert c.measured_time("ring", "all_reduce", 4) is None


def test_a_clear_win_is_the_margin_in_the_median_and_most_paired_rounds() -> None:
    for rounds in (MIN_ROUNDS, 9, 17, MAX_ROUNDS):
        native = [1.0] * rounds
        assert beats_clearly([0.5] * rounds, native)
        assert not beats_clearly([1.0 - MARGIN / 2] * rounds, native)  # within the margin
        # a median win carried by rounds in which native was slowed down is not clear
        wins = wins_needed(rounds)
        lucky = [0.5] * (wins - 1) + [1.5] * (rounds - wins + 1)
        assert statistics.median(lucky) <= 1 - MARGIN and not beats_clearly(lucky, native)
        assert beats_clearly([0.5] * wins + [1.5] * (rounds - wins), native)


def test_only_algorithms_ahead_of_native_by_the_margin_are_timed_further() -> None:
    native = [1.0, 1.1, 0.9, 1.0, 1.2]
    samples = {"native": native, "naive": [0.5] * 5, "ring": [0.9] * 5, "binomial": [0.7] * 5}
    assert contenders(samples) == ["naive", "binomial"]  # ring is within the margin
    assert contenders({"native": native, "ring": [2.0] * 5}) == []


def test_wins_needed_is_a_one_sided_sign_test() -> None:
    assert [wins_needed(n) for n in (MIN_ROUNDS, 9, MAX_ROUNDS)] == [5, 8, 18]
    for rounds in range(MIN_ROUNDS, MAX_ROUNDS + 1):
        k = wins_needed(rounds)
        tail = sum(math.comb(rounds, j) for j in range(k, rounds + 1)) / 2**rounds
        looser = tail + math.comb(rounds, k - 1) / 2**rounds
        assert tail <= SIGN_TEST_LEVEL < looser  # the smallest count within the level


def test_timed_sizes_include_one_element_per_rank() -> None:
    assert timed_sizes(4)[:3] == [4, 16, 32] and timed_sizes(2)[:3] == [4, 8, 32]
    assert timed_sizes(8)[:3] == [4, 32, 256]  # already a power of 8: no duplicate
    assert timed_sizes(4) == sorted(timed_sizes(4))


def test_auto_leaves_native_only_with_clear_wins_on_both_sides() -> None:
    native = [(4.0, 1.0), (4096.0, 1.0)]
    naive = [(4.0, 0.5), (4096.0, 2.0)]  # clearly faster at 4 B only
    ring = [(4.0, 0.7), (4096.0, 0.7)]  # clearly faster at both
    c = _calibration({"naive": [4.0]}, native=native, naive=naive)
    assert c.choose("all_reduce", 4) == "naive" and c.choose("all_reduce", 1) == "naive"
    assert c.choose("all_reduce", 4096) == "native"
    # between two timed sizes only with the evidence at both: naive's interpolated time at
    # 16 B is 0.71 (a 29% win) but it loses at 4096 B, so the curves cross somewhere between
    assert c.measured_time("naive", "all_reduce", 16) < 1 - MARGIN
    assert c.choose("all_reduce", 16) == "native"
    # beyond the largest timed size only native (an extrapolation is no evidence)
    assert c.choose("all_reduce", 8192) == "native"
    c = _calibration({"naive": [4.0], "ring": [4.0, 4096.0]}, native=native, naive=naive, ring=ring)
    assert c.choose("all_reduce", 4) == "naive"  # the fastest of those that win there
    assert c.choose("all_reduce", 64) == "ring" and c.choose("all_reduce", 4096) == "ring"
    assert c.predict("auto", "all_reduce", 4096) == 0.7
    # fast medians without the round-by-round evidence do not count
    c = _calibration({}, native=native, naive=naive, ring=ring)
    assert c.choose("all_reduce", 4) == "native" and c.choose("all_reduce", 64) == "native"


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


def test_rounds_rotate_so_every_algorithm_takes_every_position() -> None:
    names = ["native", "ring", "auto"]
    orders = [rotated(names, r) for r in range(6)]
    assert orders[0] == names and orders[1] == ["ring", "auto", "native"] and orders[3] == names
    for position in range(3):
        assert sorted(order[position] for order in orders[:3]) == sorted(names)
    assert rotated([], 5) == []


def test_cache_paths_name_the_host_backend_and_group_shape(tmp_path: Path) -> None:
    path = cache_path(tmp_path, "gloo", 4, 2)
    assert path.parent == tmp_path / "calibration"
    assert path.name == f"{socket.gethostname()}-gloo-p4-g2.json"  # the format of earlier caches


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread pinning is Linux-only")
def test_pinned_calibrations_are_cached_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cache_path(tmp_path, "gloo", 2, 1, pinned=True).name.endswith("-pinned.json")
    assert cache_path(tmp_path, "gloo", 2, 1, pinned=True) != cache_path(tmp_path, "gloo", 2, 1)
    monkeypatch.setattr(affinity, "_pinned_core", None)
    assert affinity.pinned_core() is None
    cores: list[int | None] = []
    # pin a throwaway thread, not pytest's own
    worker = threading.Thread(target=lambda: cores.append(affinity.pin_main_thread(1)))
    worker.start()
    worker.join()
    assert cores[0] is not None and affinity.pinned_core() == cores[0]


def test_a_measurement_is_announced_with_its_reason_and_a_cached_one_is_silent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A training run with --allreduce auto spends tens of seconds here before its first step
    # the first time: the user is told why and where the result goes; later runs say nothing.
    alone = SimpleNamespace(rank=0, world_size=1)  # one rank: nothing to time, nothing sent
    first = load_or_calibrate(alone, tmp_path, backend="gloo")  # type: ignore[arg-type]
    said = capsys.readouterr().err
    path = cache_path(tmp_path, "gloo", 1, 1)
    assert "calibrating the collectives (gloo, 1 rank, 1 per node; none cached" in said
    assert f"cached in {path}" in said
    assert load_or_calibrate(alone, tmp_path, backend="gloo") == first  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""
    path.write_text(path.read_text().replace(f'"version": {VERSION}', '"version": 1'))
    load_or_calibrate(alone, tmp_path, backend="gloo")  # type: ignore[arg-type]
    assert "from an older Tether" in capsys.readouterr().err
    # valid JSON of another shape failed as an AttributeError on rank 0 (the others then lost
    # their connection) instead of being measured again
    path.write_text(f'{{"version": {VERSION}, "measured": 3}}')
    load_or_calibrate(alone, tmp_path, backend="gloo")  # type: ignore[arg-type]
    assert "unreadable or from an older Tether" in capsys.readouterr().err
    load_or_calibrate(alone, tmp_path, backend="gloo", refresh=True)  # type: ignore[arg-type]
    assert "asked to measure again" in capsys.readouterr().err


def test_without_a_cache_directory_every_call_measures_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    alone = SimpleNamespace(rank=0, world_size=1)
    for _ in range(2):
        load_or_calibrate(alone, None, backend="gloo")  # type: ignore[arg-type]
        said = capsys.readouterr().err
        assert "no cache directory: for this run only" in said and "not cached" in said
    assert not list(tmp_path.rglob("*"))


def test_auto_runs_only_with_a_calibration_of_its_group() -> None:
    alone = SimpleNamespace(rank=0, world_size=1)
    with pytest.raises(TetherError, match="needs a calibration") as info:
        Auto().all_reduce(torch.ones(4), comm=alone)  # type: ignore[arg-type]
    assert "\n" not in str(info.value) and "load_or_calibrate" in str(info.value)
    with pytest.raises(TetherError, match="calibrated on 4 ranks"):
        Auto(_calibration()).all_reduce(torch.ones(4), comm=alone)  # type: ignore[arg-type]


def test_auto_says_what_it_takes_once_an_algorithm_on_rank_0(capsys) -> None:
    # a run with --allreduce auto never said what auto picked
    class Fixed:
        world_size = 2

        def choose(self, kind: str, n_bytes: float) -> str:
            return "ring" if n_bytes < 2**20 else "halving-doubling"

        def instantiate(self, algorithm: str) -> Any:
            return algorithm

    auto = Auto(Fixed())  # type: ignore[arg-type]
    first, second = SimpleNamespace(rank=0, world_size=2), SimpleNamespace(rank=1, world_size=2)
    for n_bytes in (65536, 131072, 4 * 2**20):
        auto.choose("all_reduce", n_bytes, first)  # type: ignore[arg-type]
    Auto(Fixed()).choose("all_reduce", 65536, second)  # type: ignore[arg-type]
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "tether: auto all-reduce: ring for messages of 64 KiB (the fastest the group's "
        "calibration timed there)",
        "tether: auto all-reduce: halving-doubling for messages of 4 MiB (the fastest the "
        "group's calibration timed there)",
    ]
