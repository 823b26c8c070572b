"""`tether bench comm` in one process: sizes, bandwidth factors, the measurement loop on a fake
one-rank transport, the report (table, JSON fields, plot) and the CLI's one-line errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tether.bench import comm, comm_measure
from tether.bench.comm import parse_size, parse_sizes, resolve_args
from tether.bench.comm_measure import Case, repeats_for
from tether.bench.comm_report import (
    finish_report,
    format_table,
    mean_ratio_interval,
    plot_report,
    wrong_results,
)
from tether.bench.comm_spec import busbw_factor, format_size
from tether.cli import main
from tether.comm.calibration.rounds import MAX_ITERS, iters_for
from tether.comm.collectives import collectives_for
from tether.comm.collectives.base import Collective
from tether.errors import TetherError

MB = 1 << 20


# -- sizes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "n_bytes"),
    [("4B", 4), ("4", 4), ("1KB", 1024), ("1kb", 1024), ("64MB", 64 * MB), ("2GB", 2 << 30)],
)
def test_parse_size(text: str, n_bytes: int) -> None:
    assert parse_size(text) == n_bytes


@pytest.mark.parametrize("text", ["3B", "0B", "6", "1TB", "1.5MB", "MB", "-4B", "4 B B"])
def test_bad_size_names_the_syntax(text: str) -> None:
    with pytest.raises(TetherError) as info:
        parse_size(text)
    message = str(info.value)
    assert "\n" not in message and repr(text) in message and "4B:64MB" in message


def test_range_is_powers_of_two_inclusive() -> None:
    sizes = parse_sizes("4B:64MB")
    assert sizes[0] == 4 and sizes[-1] == 64 * MB and len(sizes) == 25
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))
    assert parse_sizes("12B:64B") == (12, 24, 48)  # doubling from MIN, as nccl-tests -f 2
    assert parse_sizes("1KB:1KB") == (1024,)


def test_comma_list_is_sorted_without_repeats() -> None:
    assert parse_sizes("1MB,1KB,1024B") == (1024, MB)


@pytest.mark.parametrize("spec", ["64MB:4B", "4B:8B:16B", "", ",", "4B:", "1KB,3B"])
def test_bad_size_spec_is_one_line(spec: str) -> None:
    with pytest.raises(TetherError) as info:
        parse_sizes(spec)
    assert "\n" not in str(info.value) and "--sizes" in str(info.value)


@pytest.mark.parametrize("n_bytes", [4, 12, 1024, 1536, 3 * MB, 64 * MB, 1 << 30])
def test_format_size_round_trips(n_bytes: int) -> None:
    assert parse_size(format_size(n_bytes)) == n_bytes
    assert format_size(64 * MB) == "64MB" and format_size(1536) == "1536B"


# -- nccl-tests definitions ------------------------------------------------------------------------
def test_busbw_factors_are_nccl_tests() -> None:
    assert busbw_factor("all_reduce", 2) == 1.0
    assert busbw_factor("all_reduce", 4) == 1.5  # 2(P-1)/P
    assert busbw_factor("all_gather", 4) == 0.75  # (P-1)/P
    assert busbw_factor("reduce_scatter", 8) == 7 / 8
    assert busbw_factor("broadcast", 8) == 1.0
    assert busbw_factor("reduce", 8) == 1.0
    with pytest.raises(ValueError):
        busbw_factor("gather", 4)


def test_fewer_repeats_for_large_messages_but_never_below_three() -> None:
    assert iters_for(4) == MAX_ITERS and iters_for(64 * MB) == 1
    assert repeats_for(4, 20) == 20
    assert repeats_for(4 * MB, 20) == 20
    assert repeats_for(16 * MB, 40) == 32  # 512 MiB of calls per size
    assert repeats_for(64 * MB, 20) == 8
    assert repeats_for(256 * MB, 20) == 3
    assert repeats_for(1 << 30, 20) == 3
    assert repeats_for(64 * MB, 2) == 2  # an explicit smaller --repeats wins


# -- arguments -------------------------------------------------------------------------------------
def test_default_algorithms_are_every_one_implementing_the_op() -> None:
    args = resolve_args("allreduce", None, "4B:16B")
    assert list(args.algos) == collectives_for("all_reduce") and "native" in args.algos
    assert args.kind == "all_reduce" and args.sizes == (4, 8, 16)
    assert list(resolve_args("broadcast", None, "4B").algos) == collectives_for("broadcast")
    gather = resolve_args("allgather", None, "4B").algos
    assert gather == ("naive", "ring", "recursive-doubling", "binomial", "native", "auto")
    assert resolve_args("allreduce", "native,ring,native", "4B").algos == ("native", "ring")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"op": "scatter"}, "unknown --op 'scatter'; valid ops: allreduce, broadcast, reduce"),
        ({"algos": "rnig"}, "unknown collective 'rnig'; valid collectives: "),
        ({"algos": "chain"}, "collective 'chain' does not implement allreduce; algorithms for"),
        ({"algos": ","}, "--algo ',' names no algorithm; algorithms for allreduce: "),
        ({"op": "allgather", "algos": "chain"}, "collective 'chain' does not implement allgather"),
        ({"transport": "nccl"}, "unknown --transport 'nccl'"),
        ({"repeats": 0}, "--repeats must be in 1.."),
        ({"timeout_s": 0}, "--timeout must be a finite number of seconds >= 1"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    full = {"op": "allreduce", "algos": None, "sizes": "4B:1KB", **kwargs}
    with pytest.raises(TetherError, match=None) as info:
        resolve_args(**full)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_worker_argv_reproduces_the_arguments() -> None:
    parser = __import__("tether.bench.comm_worker", fromlist=["x"]).build_parser()
    for recalibrate, pin in ((False, True), (True, False)):
        options = {"repeats": 5, "predict": False, "recalibrate": recalibrate, "pin": pin}
        args = resolve_args("reduce", "binomial,native", "4B,1KB", **options)
        ns = parser.parse_args(comm.worker_argv(args, Path("x.json"), 30.0))
        assert comm.args_from_namespace(ns) == resolve_args(
            "reduce",
            "binomial,native",
            "4B,1KB",
            timeout_s=30.0,
            **options,
        )


def test_pinning_takes_one_core_for_the_calling_thread_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import threading

    from tether.launch import affinity
    from tether.launch.affinity import pin_main_thread

    # the module remembers the pin (calibrations are cached apart): forget it afterwards
    monkeypatch.setattr(affinity, "_pinned_core", None)
    before = os.sched_getaffinity(0)
    seen: dict[str, set[int]] = {}
    try:

        def other() -> None:
            seen["other"] = os.sched_getaffinity(0)

        thread = threading.Thread(target=other)
        core = pin_main_thread(len(before) + 1)  # wraps around the usable cores
        assert core == sorted(before)[(len(before) + 1) % len(before)]
        assert os.sched_getaffinity(0) == {core}
        thread.start()  # a thread started later inherits the pin (so: pin after the backend)
        thread.join()
        assert seen["other"] == {core}
    finally:
        os.sched_setaffinity(0, before)
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "64MB:4B"], "bad --sizes '64MB:4B'"),
        (["--op", "gather"], "unknown --op 'gather'"),
        (["--algo", "chain"], "collective 'chain' does not implement allreduce"),
        (["--workers", "1"], "--workers must be >= 2"),
    ],
)
def test_cli_errors_are_one_line(capsys, tmp_path: Path, argv: list[str], message: str) -> None:
    assert main(["bench", "comm", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tether: error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()  # nothing started


# -- correctness oracle ----------------------------------------------------------------------------
def _run_case(kind: str, world: int, n_bytes: int) -> list[Case]:
    """Every rank's case, with the collective's result computed by hand."""
    cases = [Case(kind, n_bytes, r, world, torch.device("cpu")) for r in range(world)]
    if kind == "all_reduce":
        total = sum(c.init for c in cases)
        for c in cases:
            c.buf.copy_(total)
    elif kind == "all_gather":
        gathered = torch.cat([c.init.view(world, -1)[c.rank] for c in cases])
        for c in cases:
            c.buf.copy_(gathered)
    return cases


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("kind", ["all_reduce", "all_gather"])
def test_expected_result_is_the_exact_collective(kind: str, world: int) -> None:
    cases = _run_case(kind, world, 4 * 1000)
    assert all(c.check() for c in cases)
    cases[1].buf[7] += 1  # one wrong element on one rank
    assert not cases[1].check() and cases[0].check()


def test_all_gather_size_is_the_gathered_output() -> None:
    case = Case("all_gather", 4 * 1024, 1, 4, torch.device("cpu"))
    assert case.buf.numel() == 1024 and case.n_bytes == 4096
    assert (case.buf[256:512] > 0).all() and (case.buf[:256] == -1).all()  # only its own chunk
    assert not case.check()  # before the all-gather
    odd = Case("all_gather", 4 * 10, 0, 3, torch.device("cpu"))  # 10 elements, 3 ranks
    assert odd.n_bytes == 4 * 9  # whole elements per rank, as bytes measured


def test_reduce_result_is_only_checked_on_the_root() -> None:
    root = Case("reduce", 64, 0, 2, torch.device("cpu"))
    other = Case("reduce", 64, 1, 2, torch.device("cpu"))
    assert not root.check()  # still the input: not reduced
    assert other.check()


# -- measurement loop on a one-rank fake transport ---------------------------------------------
class OneRank:
    """A transport of one rank: every collective is the identity."""

    rank, world_size = 0, 1

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False) -> None:
        pass

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> None:
        pass

    def reduce(self, tensor: torch.Tensor, dst: int, op: str = "sum") -> None:
        pass

    def barrier(self) -> None:
        pass


def test_measure_rows_and_a_wrong_algorithm_flagged(monkeypatch) -> None:
    real = comm_measure.collective_call

    def call(kind: str, collective: Collective, case: Case, transport: Any) -> Any:
        if collective.name == "ring":  # a "fast" one that doubles instead of summing over 1 rank
            return lambda: case.buf.mul_(2)
        return real(kind, collective, case, transport)

    monkeypatch.setattr(comm_measure, "collective_call", call)
    args = resolve_args("allreduce", "ring,native", "4B,1KB", repeats=3, predict=False)
    raw = comm_measure.measure(OneRank(), args, torch.device("cpu"), predict=lambda a, k, n: 1e-3)
    assert [(r["algo"], r["bytes"]) for r in raw["rows"]] == [
        ("ring", 4),
        ("native", 4),
        ("ring", 1024),
        ("native", 1024),
    ]
    for row in raw["rows"]:
        assert row["correct"] == (row["algo"] == "native")
        assert len(row["times_s"]) == row["repeats"] == 3
        assert row["time_s"] == sorted(row["times_s"])[1] and row["time_s"] > 0
        low, mid = sorted(row["times_s"])[:2]
        assert row["quartile_s"] == pytest.approx((low + mid) / 2)
        assert row["mean_s"] == pytest.approx(sum(row["times_s"]) / 3)
        assert row["predicted_s"] == 1e-3
    report = finish_report(raw, {"op": "allreduce", "workers": 1, "transport": "torch"})
    assert all(r["vs_native"] is None for r in report["rows"] if r["algo"] == "ring")
    assert wrong_results(report) == ["ring at 4B", "ring at 1KB"]


class TwoRanksAlone(OneRank):
    """Rank 0 of a pretend group of 2 whose collectives do nothing (results come out wrong)."""

    world_size = 2

    def all_gather(self, tensor: torch.Tensor) -> None:
        pass


def test_all_gather_sizes_that_round_alike_are_measured_once() -> None:
    # with 2 ranks a 4 B all-gather is 8 B: one float32 from each rank
    args = resolve_args("allgather", "native", "4B,8B,16B", repeats=1, predict=False)
    raw = comm_measure.measure(TwoRanksAlone(), args, torch.device("cpu"))
    assert [r["bytes"] for r in raw["rows"]] == [8, 16]
    assert not any(r["correct"] for r in raw["rows"])  # nothing was gathered


def test_algorithm_refusing_the_group_is_skipped(monkeypatch) -> None:
    real = comm_measure.collective_call

    def call(kind: str, collective: Collective, case: Case, transport: Any) -> Any:
        if collective.name == "halving-doubling":

            def refuse() -> None:
                raise TetherError("needs a power-of-two group")

            return refuse
        return real(kind, collective, case, transport)

    monkeypatch.setattr(comm_measure, "collective_call", call)
    args = resolve_args("allreduce", "halving-doubling,native", "4B,8B", predict=False)
    raw = comm_measure.measure(OneRank(), args, torch.device("cpu"))
    assert {r["algo"] for r in raw["rows"]} == {"native"}
    assert raw["skipped"] == {"halving-doubling": "needs a power-of-two group"}


def test_auto_is_timed_with_the_calibration_it_is_given() -> None:
    # The registered auto has no calibration: it refuses (skipped, with the way to get one);
    # the worker hands measure a calibrated one, which runs what the calibration chooses.
    from tether.comm.calibration.model import Calibration
    from tether.comm.collectives.auto import Auto

    args = resolve_args("allreduce", "auto,native", "4B", repeats=1, predict=False)
    raw = comm_measure.measure(OneRank(), args, torch.device("cpu"))
    assert "needs a calibration" in raw["skipped"]["auto"]
    alone = Calibration(1, 1, 1e-5, 1e-9, 1e-10, 1e-5, 1e-9)  # chooses native: nothing timed
    auto = Auto(alone)
    raw = comm_measure.measure(OneRank(), args, torch.device("cpu"), collectives={"auto": auto})
    assert [(r["algo"], r["correct"]) for r in raw["rows"]] == [("auto", True), ("native", True)]
    assert not raw["skipped"]


# -- report ----------------------------------------------------------------------------------------
def fake_report(workers: int = 4) -> dict[str, Any]:
    rows = []
    for n_bytes in (4, 4096, MB):
        for algo, speed, correct in (
            ("ring", 2.0, True),
            ("naive", 4.0, False),
            ("native", 1.0, True),
        ):
            rows.append(
                {
                    "algo": algo,
                    "bytes": n_bytes,
                    "time_s": (1e-5 + n_bytes * 1e-9) / speed,
                    "quartile_s": 1e-5 / speed / (3.0 if algo == "ring" else 1.0),
                    "mean_s": 1e-5 / speed / (5.0 if algo == "ring" else 1.0),
                    "times_s": [],
                    "iters": 1,
                    "repeats": 3,
                    "correct": correct,
                    "predicted_s": 2e-5 + n_bytes * 1e-9 if algo == "ring" else None,
                }
            )
    raw = {"rows": rows, "skipped": {"chain": "does not implement all_reduce"}, "bench_s": 1.0}
    meta = {"op": "allreduce", "workers": workers, "transport": "torch", "backend": "gloo"}
    return finish_report(raw, meta)


def test_bandwidths_and_ratio_to_native() -> None:
    report = fake_report(workers=4)
    assert report["busbw_factor"] == 1.5 and report["kind"] == "all_reduce"
    ring = next(r for r in report["rows"] if r["algo"] == "ring" and r["bytes"] == MB)
    assert ring["algbw_GBps"] == pytest.approx(MB / ring["time_s"] / 1e9)
    assert ring["busbw_GBps"] == pytest.approx(ring["algbw_GBps"] * 1.5)
    assert ring["vs_native"] == pytest.approx(2.0)  # twice as fast as native
    assert ring["vs_native_quartile"] == pytest.approx(6.0)  # its own statistic, not the median
    assert ring["vs_native_mean"] == pytest.approx(10.0)
    native = next(r for r in report["rows"] if r["algo"] == "native" and r["bytes"] == 4)
    assert native["vs_native"] == pytest.approx(1.0)
    wrong = [r for r in report["rows"] if r["algo"] == "naive"]
    assert wrong and all(r["vs_native"] is None for r in wrong)  # fast but wrong: no ratio
    assert all(r["vs_native_quartile"] is None for r in wrong)
    assert all(r["vs_native_mean"] is None for r in wrong)
    json.dumps(report)  # the report is plain JSON


def test_mean_ratio_interval_resamples_repeats_in_pairs() -> None:
    # A slow spell hits both algorithms in the same rounds: resampled in pairs, every resample
    # keeps the ratio at exactly 2 (resampled independently, it would swing widely).
    native = [1.0, 9.0, 1.0, 1.0, 9.0, 1.0, 9.0, 1.0]
    assert mean_ratio_interval(native, [t / 2 for t in native]) == pytest.approx((2.0, 2.0))
    # Unpaired noise: the interval holds the point estimate and narrows with more repeats.
    noise = itertools.cycle([0.7, 1.3, 1.0, 0.8, 1.2, 1.1, 0.9])
    ring = [next(noise) for _ in range(700)]
    native = [1.0] * 700
    estimate = sum(native) / sum(ring)
    low, high = mean_ratio_interval(native, ring)
    assert low < estimate < high and high - low < 0.05
    few_low, few_high = mean_ratio_interval(native[:35], ring[:35])
    assert few_high - few_low > 2 * (high - low)
    assert mean_ratio_interval(native, ring) == (low, high)  # seeded: the same run, the same text
    with pytest.raises(ValueError, match="paired repeats"):
        mean_ratio_interval([1.0, 2.0], [1.0])


def test_table() -> None:
    lines = format_table(fake_report()).splitlines()
    assert lines[0].split() == [
        "size",
        "algo",
        "time_us",
        "algbw",
        "GB/s",
        "busbw",
        "GB/s",
        "pred_us",
        "vs",
        "native",
        "correct",
    ]
    ring = next(line for line in lines if line.startswith("1MB") and " ring " in line).split()
    # 1 MiB at (1e-5 + 2^20 * 1e-9) / 2 s = 529.3 us; algbw = 1.981 GB/s; busbw = x1.5
    assert ring == ["1MB", "ring", "529.3", "1.98", "2.97", "1069", "2.00", "yes"]
    # which way the ratio goes (only the docs said it)
    assert (
        lines[-2] == "vs native: native's time over the algorithm's (above 1: faster than native)"
    )
    naive = next(line for line in lines if line.startswith("4B") and " naive " in line).split()
    assert naive[-2:] == ["-", "WRONG"] and naive[5] == "-"
    assert lines[-1] == "skipped chain: does not implement all_reduce"
    assert len(lines) == 1 + 9 + 1 + 1


def test_plot_is_written(tmp_path: Path) -> None:
    path = tmp_path / "comm.png"
    plot_report(fake_report(), path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_emulated_node_layout_errors() -> None:
    from tether.bench.emulated import check_nodes

    check_nodes(4, 2, 1000.0)  # a valid layout passes
    with pytest.raises(TetherError, match="does not split into --nodes 3"):
        check_nodes(4, 3, None)
    with pytest.raises(TetherError, match="give --nodes >= 2"):
        check_nodes(4, 1, 100.0)
    for rate in (0.0, float("nan"), float("inf")):  # nan and inf crashed after the set-up
        with pytest.raises(TetherError, match="--link-mbit must be a finite rate > 0"):
            check_nodes(4, 2, rate)


def test_an_out_that_cannot_be_a_directory_is_one_line(tmp_path: Path, capsys) -> None:
    """A file in the way raised FileExistsError (or NotADirectoryError) with a traceback."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    for out in (blocker, blocker / "under"):
        code = main(["bench", "comm", "--algo", "ring", "--sizes", "4B", "--out", str(out)])
        said = capsys.readouterr().err.strip()
        assert code == 2 and said.startswith(f"tether: error: --out {out}: cannot make"), said


def test_an_emulated_cluster_calibrates_afresh_in_a_reused_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibration cache of an earlier run in the same --out (another link rate) was reused:
    a run at 10 Mbit/s predicted with the 1000 Mbit/s calibration, 100 times off."""
    import contextlib
    from types import SimpleNamespace

    import tether.launch.netns as netns
    import tether.launch.netns_torchrun as netns_torchrun
    from tether.bench.emulated import launch_emulated

    stale = tmp_path / "calibration" / "host-gloo-p2-g1.json"
    stale.parent.mkdir()
    stale.write_text("{}")
    seen: list[bool] = []

    def torchrun_across(cluster, per_node, argv, timeout, env, python):
        seen.append(Path(env["TETHER_CACHE_DIR"], stale.name).exists())
        return SimpleNamespace(output=lambda: "", failure=lambda: None)

    monkeypatch.setattr(netns, "available", lambda: None)
    monkeypatch.setattr(netns, "EmulatedCluster", lambda n, link_mbit: contextlib.nullcontext())
    monkeypatch.setattr(netns_torchrun, "torchrun_across", torchrun_across)
    launch_emulated(2, 2, 10.0, "tether.bench.comm_worker", [], 10.0, tmp_path)
    assert seen == [False]
