"""Multi-node runs for real, on an emulated cluster: network namespaces as nodes, veth links
through a bridge, tbf-shaped to 100 Mbit/s between nodes (tether.launch.netns).

What is checked: the nodes reach each other over TCP and nothing else; shaping really limits a
transfer; one torchrun job with a c10d rendezvous across 2 nodes x 2 processes places ranks
contiguously per node and runs every all-reduce exactly over gloo on the veths (and the
hierarchical one with fewer bytes across nodes than the ring); ``python -m tether.run`` trains
across the nodes; teardown leaves nothing behind, also on errors and timeouts.

Each torchrun start costs seconds on a 2-core machine, so one job runs all collective checks
(worker_checks.py) and one more runs the training. Without root, ``ip``/``tc`` or namespace
support the tests skip with the reason.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tether.comm.calibration.cache import cache_path
from tether.comm.calibration.model import Calibration
from tether.comm.collectives import COLLECTIVES, collectives_for
from tether.launch import netns_torchrun
from tether.launch.netns import (
    NETNS_ETC,
    EmulatedCluster,
    NetnsError,
    available,
    cleanup_stale,
    our_namespaces,
)
from tether.launch.netns_tcp import tcp_transfer
from tether.launch.netns_torchrun import TorchrunResult, torchrun_across

HERE = Path(__file__).parent
LINK_MBIT = 100
NPROC = 2
REASON = available()
needs_netns = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmulatedCluster]:
    with EmulatedCluster(2, link_mbit=LINK_MBIT) as c:
        yield c
    assert not set(c.namespaces) & set(our_namespaces()), "namespaces left after teardown"


def _ok(result: TorchrunResult) -> None:
    assert result.ok, f"{result.failure()}\n{result.output(tail=5000)}"


def _tx_bytes(cluster: EmulatedCluster, i: int) -> int:
    path = f"/sys/class/net/{cluster.interface(i)}/statistics/tx_bytes"
    return int(cluster.run(i, ["cat", path], timeout=10).stdout)


def test_bad_arguments_are_one_line_errors() -> None:
    for kwargs in ({"nodes": 0}, {"link_mbit": 0}, {"subnet": 256}):
        with pytest.raises(NetnsError, match=r"^[^\n]+$"):
            EmulatedCluster(**kwargs)


@needs_netns
def test_nodes_reach_each_other_over_tcp_and_nothing_else(cluster: EmulatedCluster) -> None:
    for src, dst in ((0, 1), (1, 0)):
        assert tcp_transfer(cluster, src, dst, 1000, timeout=20) > 0
    for i in range(cluster.nodes):
        links = cluster.run(i, ["ip", "-o", "link", "show"], timeout=10).stdout
        names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
        assert names == {"lo", cluster.interface(i)}, links
        routes = cluster.run(i, ["ip", "route", "show"], timeout=10).stdout
        assert "default" not in routes, "a node must not reach the host's network"


@needs_netns
def test_shaped_link_limits_a_large_transfer(cluster: EmulatedCluster) -> None:
    nbytes = 5_000_000
    predicted = nbytes * 8 / (LINK_MBIT * 1e6)  # 0.4 s; the headers make it slower still
    shaped = tcp_transfer(cluster, 0, 1, nbytes)
    assert shaped >= 0.8 * predicted, f"{shaped:.3f} s for {nbytes} B: the link is not shaped"
    with EmulatedCluster(2) as free:  # the same transfer on an unshaped veth: the method works
        unshaped = tcp_transfer(free, 0, 1, nbytes)
    assert unshaped < 0.5 * shaped, f"unshaped {unshaped:.3f} s vs shaped {shaped:.3f} s"


def _seed_calibration(cache: Path, world: int) -> None:
    """A calibration of this group shape in ``cache``, with round numbers, for the workers'
    ``auto``: measuring one over the capped veths takes over a minute, and the measurement
    (the inter-node link included) is checked on its own in
    tests/distributed/test_reducer_and_auto.py. Without measured times ``auto`` chooses by the
    model, which is what is exercised here: that its choice runs correctly across nodes."""
    seeded = Calibration(
        world_size=world,
        ranks_per_node=NPROC,
        alpha=1e-4,
        beta=1e-8,
        gamma=1e-10,
        inter_alpha=5e-4,
        inter_beta=1e-7,
        backend="gloo",
        host="seeded",
    )
    path = cache_path(cache, "gloo", world, NPROC)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(seeded.to_json())


@needs_netns
def test_one_torchrun_job_across_nodes(cluster: EmulatedCluster, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cache = tmp_path / "cache"
    _seed_calibration(cache, cluster.nodes * NPROC)
    script = [str(HERE / "worker_checks.py"), str(out)]
    result = torchrun_across(cluster, NPROC, script, 90, env={"TETHER_CACHE_DIR": str(cache)})
    _ok(result)
    report = json.loads(out.read_text())
    world = cluster.nodes * NPROC
    assert report["world_size"] == world
    assert report["calibration_host"] == "seeded"

    for p in report["placements"]:
        node, group_rank = int(p["tether_netns_node"]), int(p["group_rank"])
        # torchrun's c10d rendezvous: ranks contiguous per node, node i is group rank i
        assert int(p["rank"]) == group_rank * NPROC + int(p["local_rank"]), p
        assert group_rank == node, p
        assert p["local_world_size"] == str(NPROC), p
        assert p["master_addr"] == cluster.address(0), p
        assert p["gloo_socket_ifname"] == cluster.interface(node), p
    assert sorted(int(p["rank"]) for p in report["placements"]) == list(range(world))

    failures = [f for r in report["per_rank"] for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert set(report["checked"]) >= {"torch.distributed", *collectives_for("all_reduce")}

    # Bytes each node sent over its link for one all-reduce of n float32: at least the payload,
    # which proves gloo used the veths; the ring sends 2(P-1)/P n from each node, hierarchical
    # 2(N-1)/N n.
    payload = report["big_elements"] * 4
    for r in report["per_rank"]:
        sent = r["cross_node_bytes"]
        assert sent["ring"] >= 2 * (world - 1) / world * payload, sent
        assert sent["torch.distributed"] >= payload, sent
        if "hierarchical" in COLLECTIVES:
            assert sent["hierarchical"] >= payload, sent
            assert sent["hierarchical"] <= 0.8 * sent["ring"], sent
    if "hierarchical" in COLLECTIVES:
        assert report["hierarchical"]["ranks_per_node"] == NPROC
        assert "hierarchical (constructed)" in report["checked"]


# Slow: the default run checks the pieces: every all-reduce across these nodes, the ranks'
# placement and the bytes on the veths (test_one_torchrun_job_across_nodes), and the same worker
# entry under torchrun on one machine (tests/entry/test_train_e2e.py).
@needs_netns
@pytest.mark.slow
def test_training_across_nodes(cluster: EmulatedCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    steps, workers = 20, cluster.nodes * NPROC
    args = ["--method", "sync-sgd", "--dataset", "digits", "--model", "mlp"]
    args += ["--steps", str(steps), "--workers", str(workers), "--out", str(run_dir)]
    if "hierarchical" in COLLECTIVES:
        args += ["--allreduce", "hierarchical"]
    before = [_tx_bytes(cluster, i) for i in range(cluster.nodes)]
    result = torchrun_across(cluster, NPROC, ["-m", "tether.run", *args], 120)
    _ok(result)
    sent = [_tx_bytes(cluster, i) - before[i] for i in range(cluster.nodes)]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == workers
    assert summary["steps"] == steps
    assert math.isfinite(summary["final_test_loss"])
    # Every step all-reduces the gradients across the 2 nodes: each node sends at least the
    # model's size per step (any all-reduce between 2 nodes must), over its veth, not loopback.
    state = torch.load(run_dir / "model.pt", weights_only=True)
    model_bytes = sum(t.numel() * t.element_size() for t in state.values())
    assert min(sent) >= steps * model_bytes, (sent, model_bytes)


@needs_netns
@pytest.mark.slow
def test_two_level_easgd_across_nodes_is_the_emulated_one(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    # The nodes come from the launcher (LOCAL_WORLD_SIZE = 2 on each of 2 nodes); the same run on
    # one machine with --ranks-per-node 2 must give the very same weights: the method is
    # deterministic and the layout, not the network, decides what it computes.
    # (Slow: the default run checks the launcher's layout against --ranks-per-node on one
    # spawned group, tests/distributed/test_two_level_easgd.py, and the collectives across these
    # nodes in test_one_torchrun_job_across_nodes.)
    steps, workers = 12, cluster.nodes * NPROC
    args = ["--method", "two-level-easgd", "--dataset", "digits", "--model", "mlp", "--tau", "2"]
    args += ["--steps", str(steps), "--workers", str(workers), "--timeout", "30"]
    across, local = tmp_path / "across", tmp_path / "local"
    before = [_tx_bytes(cluster, i) for i in range(cluster.nodes)]
    _ok(torchrun_across(cluster, NPROC, ["-m", "tether.run", *args, "--out", str(across)], 120))
    sent = [_tx_bytes(cluster, i) - before[i] for i in range(cluster.nodes)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "tether", "train", *args, "--ranks-per-node", "2"]
    done = subprocess.run(
        [*command, "--out", str(local), "--no-progress"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((across / "summary.json").read_text())
    assert (summary["nodes"], summary["ranks_per_node"], summary["rounds"]) == (2, 2, steps // 2)
    a = torch.load(across / "model.pt", weights_only=True)
    b = torch.load(local / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # Only the elastic rounds cross the network: each rank's chunk of the model, twice per
    # round (a sum between 2 nodes), far less than sync-sgd's gradients every step.
    model_bytes = sum(t.numel() * t.element_size() for t in a.values())
    assert min(sent) >= (steps // 2) * model_bytes / 2, (sent, model_bytes)
    assert max(sent) < steps * model_bytes, (sent, model_bytes)


@needs_netns
@pytest.mark.slow
def test_parameter_server_across_nodes(cluster: EmulatedCluster, tmp_path: Path) -> None:
    # The server (rank 0, node 0) listens for its workers' connections on node 0's address (the
    # rendezvous address), not loopback: the workers of node 1 reach it over the veth, and
    # every exchange (the model out and back) crosses it.
    steps, workers = 12, cluster.nodes * NPROC - 1
    args = ["--method", "async-easgd", "--dataset", "digits", "--model", "mlp", "--tau", "2"]
    args += ["--steps", str(steps), "--workers", str(workers), "--timeout", "30"]
    run_dir = tmp_path / "run"
    before = [_tx_bytes(cluster, i) for i in range(cluster.nodes)]
    _ok(torchrun_across(cluster, NPROC, ["-m", "tether.run", *args, "--out", str(run_dir)], 120))
    sent = [_tx_bytes(cluster, i) - before[i] for i in range(cluster.nodes)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["lost_workers"] == [] and summary["steps"] == steps, summary
    state = torch.load(run_dir / "model.pt", weights_only=True)
    model_bytes = sum(t.numel() * t.element_size() for t in state.values())
    # Node 1's NPROC workers each exchange every tau steps: the model goes both ways.
    exchanges = NPROC * steps // 2
    assert min(sent) >= exchanges * model_bytes, (sent, model_bytes)


@needs_netns
def test_torchrun_across_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stand-ins for torchrun, so no torch start-up is paid: node 1 fails at once, node 0 would
    # wait forever (as an agent waits for a rendezvous whose peer died).
    def argv(cluster: EmulatedCluster, node: int, *_: object) -> list[str]:
        if node == 1:
            return [sys.executable, "-c", "print('node 1 broke'); raise SystemExit(3)"]
        return ["sleep", "60"]

    monkeypatch.setattr(netns_torchrun, "torchrun_argv", argv)
    with EmulatedCluster(2) as c:
        failed = torchrun_across(c, 1, [], timeout=30)
        assert failed.seconds < 10 and not failed.timed_out
        assert [n.returncode for n in failed.nodes] == [None, 3]
        assert failed.failure() == "node 1 exited with code 3"
        assert "node 1 broke" in failed.output()

        monkeypatch.setattr(netns_torchrun, "torchrun_argv", lambda *_: ["sleep", "60"])
        hung = torchrun_across(c, 1, [], timeout=1)
        assert hung.timed_out and not hung.ok
        assert [n.returncode for n in hung.nodes] == [None, None]
        assert hung.failure() == "torchrun job timed out after 1 s"


@needs_netns
def test_teardown_removes_everything_on_error() -> None:
    with pytest.raises(RuntimeError, match="boom"), EmulatedCluster(2, link_mbit=1000) as c:
        names = [*c.namespaces, c.switch]
        sleeper = c.popen(1, ["sleep", "60"])
        assert set(names) <= set(our_namespaces())
        raise RuntimeError("boom")
    assert sleeper.poll() is not None, "a process started in a node survived the teardown"
    assert not set(names) & set(our_namespaces())
    assert not any((NETNS_ETC / name).exists() for name in names)


@needs_netns
def test_run_timeout_kills_the_whole_process_tree() -> None:
    # The child moves to a session of its own (as torchrun's workers do) and outlives its parent.
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with EmulatedCluster(1) as c:
        start = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired) as caught:
            c.run(0, [sys.executable, "-c", script], timeout=2)
        assert time.monotonic() - start < 10
        output = caught.value.output
        assert output, "the output before the timeout is kept"
        grandchild = int(output if isinstance(output, str) else output.decode())
        time.sleep(0.2)
        assert not _alive(grandchild), "the timeout left a descendant running"


@needs_netns
def test_cleanup_removes_namespaces_of_dead_processes_only() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"tether-{dead.pid}-0-n0", f"tether-{os.getpid()}-999-n0"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = cleanup_stale()  # (a concurrent run's cleanup may have removed it first)
        assert live not in removed
        assert live in our_namespaces()
        assert stale not in our_namespaces()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
