"""`tether bench comm` end to end: real ranks, a real report, and a hung rank that cannot hang it.
The allreduce run is also watched for where its processes listen (loopback only: see
tests/entry/test_listeners.py)."""

from __future__ import annotations

import json
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.conftest import is_loopback, run_cli, run_cli_listening
from tether.bench import comm, comm_launch
from tether.comm.calibration.cache import cache_path
from tether.comm.calibration.model import Calibration
from tether.errors import WorkerFailure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# The predictions come from this group shape's calibration in the cache. Measuring one takes
# about 20 s here and is checked on its own (tests/distributed/test_reducer_and_auto.py: measured,
# cached, read back); this run is given one with round numbers, so the report's predictions can
# be checked against the model to the last digit.
SEEDED = Calibration(
    world_size=2,
    ranks_per_node=2,
    alpha=2e-5,
    beta=1e-9,
    gamma=5e-11,
    inter_alpha=2e-5,
    inter_beta=1e-9,
    measured={"all_reduce": {"native": [(4.0, 3e-5), (4096.0, 6e-5)]}},
    backend="gloo",
    host="seeded",
    measured_at="2026-11-25T00:00:00+00:00",
)


def test_allreduce_ring_and_native(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TETHER_CACHE_DIR", str(cache))
    seeded = cache_path(cache, "gloo", 2, 2)
    seeded.parent.mkdir(parents=True)
    seeded.write_text(SEEDED.to_json())
    out = tmp_path / "bench"
    result, listening = run_cli_listening(
        "bench",
        "comm",
        "--op",
        "allreduce",
        "--algo",
        "ring,native",
        "--sizes",
        "4B:4KB",
        "--workers",
        "2",
        "--repeats",
        "3",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "comm.json").read_text())
    assert report["workers"] == 2 and report["op"] == "allreduce" and report["backend"] == "gloo"
    assert report["command"].startswith("tether bench comm --op allreduce")
    sizes = [4 << i for i in range(11)]  # 4 B .. 4 KiB
    assert [(r["algo"], r["bytes"]) for r in report["rows"]] == [
        (algo, size) for size in sizes for algo in ("ring", "native")
    ]
    for row in report["rows"]:
        assert row["correct"] is True
        assert row["repeats"] == 3 and len(row["times_s"]) == 3 and row["time_s"] > 0
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])  # 2(P-1)/P = 1 for P = 2
        assert row["vs_native"] is not None and row["vs_native"] > 0
        expected = SEEDED.predict(row["algo"], "all_reduce", row["bytes"])
        assert expected is not None and row["predicted_s"] == pytest.approx(expected)
    assert report["predictions"]["source"] == "tether.comm.calibration"
    assert report["predictions"]["host"] == "seeded" and "calibrating" not in result.stderr
    assert (out / "comm.png").read_bytes()[:8] == PNG_MAGIC
    assert not list(out.glob("hang-*.txt"))
    table = result.stdout.strip().splitlines()
    assert table[0].split()[:3] == ["size", "algo", "time_us"] and len(table) == 1 + 22 + 1
    assert table[1].split()[:2] == ["4B", "ring"] and table[-2].split()[-1] == "yes"
    assert table[-1].startswith("vs native: native's time over the algorithm's")
    assert "tether bench: 4B ring (1/11 sizes" in result.stderr  # progress
    # Nothing it started listened outside loopback: the rendezvous store and the workers' store
    # at least (gloo's pairs add their own).
    assert len(listening) >= 2, listening
    assert sorted(a for a in listening if not is_loopback(a)) == []


def test_hung_rank_ends_the_run_within_the_timeout(tmp_path: Path) -> None:
    args = comm.resolve_args("allreduce", "native", "4B", repeats=1, predict=False)
    argv = [*comm.worker_argv(args, tmp_path / "comm.json", 3.0), "--debug-hang-rank", "1"]
    start = time.monotonic()
    with pytest.raises(WorkerFailure) as info:
        comm_launch.launch_torch(2, argv, 3.0, tmp_path)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "did not finish within --timeout 3 s" in message and "\n" not in message
    # Whichever rank's deadline fires first leaves its stacks (the other is then stopped by the
    # launcher): rank 1 sleeping, or rank 0 waiting for it in a collective, in _run_rank. Rank
    # 0's collective times out at the same 3 s: its deadline can fire as it cancels it, in run's
    # cleanup (seen once in CI, 2026-11-28), so one file, not every one, must show _run_rank.
    hang_files = sorted(tmp_path.glob("hang-rank*.txt"))
    assert hang_files, "no rank left its stacks"
    stacks = [f.read_text() for f in hang_files]
    assert all("comm_worker.py" in text for text in stacks)
    assert any("_run_rank" in text for text in stacks), stacks
    assert all(f.name in message for f in hang_files)
    assert elapsed < 3.0 + 30  # the deadline, plus starting Python and torch on a busy machine
    assert not (tmp_path / "comm.json").exists()


def test_allgather_every_algorithm_on_3_ranks(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    algos = ("naive", "ring", "recursive-doubling", "binomial", "native")
    argv = ["--op", "allgather", "--algo", ",".join(algos), "--sizes", "12B,12KB"]
    argv += ["--workers", "3", "--repeats", "2", "--no-predict", "--out", str(out), "--quiet"]
    result = run_cli("bench", "comm", *argv)
    assert result.returncode == 0, result.stderr
    assert "tether bench: 12B" not in result.stderr  # --quiet: no progress lines
    report = json.loads((out / "comm.json").read_text())
    assert report["op"] == "allgather" and report["busbw_factor"] == pytest.approx(2 / 3)
    # the size is the gathered output (nccl-tests): 4 bytes, then 4 KiB, from each of 3 ranks
    assert [(r["algo"], r["bytes"]) for r in report["rows"]] == [
        (algo, size) for size in (12, 12 << 10) for algo in algos
    ]
    assert all(row["correct"] is True for row in report["rows"])


@pytest.mark.skipif(find_spec("mpi4py") is None, reason="mpi4py not installed (tether[mpi])")
def test_broadcast_on_the_mpi_transport(tmp_path: Path) -> None:
    from tether.launch.mpi import mpiexec_path

    if mpiexec_path() is None:
        pytest.skip("no mpiexec")
    out = tmp_path / "bench"
    result = run_cli(
        "bench",
        "comm",
        "--transport",
        "mpi",
        "--op",
        "broadcast",
        "--algo",
        "binomial,native",
        "--sizes",
        "4B,64KB",
        "--workers",
        "2",
        "--repeats",
        "2",
        "--no-predict",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "comm.json").read_text())
    assert report["transport"] == "mpi" and report["busbw_factor"] == 1.0
    assert [(r["algo"], r["bytes"], r["correct"]) for r in report["rows"]] == [
        ("binomial", 4, True),
        ("native", 4, True),
        ("binomial", 64 << 10, True),
        ("native", 64 << 10, True),
    ]
    assert (out / "comm.png").read_bytes()[:8] == PNG_MAGIC
