"""Worker of the cross-namespace torchrun job: many checks in one job, because each torchrun start
costs seconds on a 2-core machine.

Run by torchrun in every node (``worker_checks.py RESULT.json``). Every rank makes the same
collective calls in the same order and records failures instead of raising, so one wrong result
cannot desynchronise the ranks; rank 0 writes everything to RESULT.json and the test asserts on it.

Expected results are exact: the data are integers (int64, and float32 below 2^20, whose sums of 4
terms are exact), so any correct summation order gives the same bits.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from tether.comm.calibration.cache import load_or_calibrate
from tether.comm.collectives import COLLECTIVES, collectives_for
from tether.comm.collectives.auto import Auto
from tether.comm.collectives.base import Collective
from tether.comm.collectives.hierarchical import Hierarchical, launch_node_size
from tether.comm.transport import TorchTransport
from tether.launch.env import cache_dir, launcher_local_world_size
from tether.launch.teardown import before_init_process_group, shut_down_process_group

LENGTHS = (1, 3, 7, 1000, 100_003)
BIG = 500_000  # elements of the all-reduces whose cross-node bytes are counted
DTYPES = (torch.int64, torch.float32)


def data(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * rank + n)
    return torch.randint(-(2**18), 2**18, (n,), generator=g).to(dtype)


def tx_bytes() -> int:
    """Bytes this node has sent on its veth (``ip netns exec`` mounts the namespace's sysfs)."""
    iface = os.environ["GLOO_SOCKET_IFNAME"]
    return int(Path(f"/sys/class/net/{iface}/statistics/tx_bytes").read_text())


def node_tx(run: Callable[[], object]) -> int:
    """Bytes this node's veth sent while ``run()`` ran on every rank (the barriers add a few).
    The barrier after the first reading keeps a rank of this node from sending before the other
    has read the counter."""
    dist.barrier()
    before = tx_bytes()
    dist.barrier()
    run()
    dist.barrier()
    return tx_bytes() - before


def main() -> int:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    before_init_process_group()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    failures: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            failures.append(f"rank {rank}: {what}")

    env = os.environ
    placement = {
        key.lower(): env.get(key)
        for key in (
            "RANK",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "GLOO_SOCKET_IFNAME",
            "TETHER_NETNS_NODE",
        )
    }
    placements: list[object] = [None] * world
    dist.all_gather_object(placements, placement)

    # The collectives read no environment: the node layout is the launcher's, passed explicitly,
    # and "auto" runs on a calibration of this group (cached where tether's commands cache it).
    ranks_per_node = launch_node_size(world, launcher_local_world_size())
    calibration = load_or_calibrate(TorchTransport(), cache_dir(), ranks_per_node)
    built: dict[str, Collective] = {
        "hierarchical": Hierarchical(ranks_per_node=ranks_per_node),
        "auto": Auto(calibration),
    }

    def collective(name: str) -> Collective:
        return built[name] if name in built else COLLECTIVES.get(name)

    names = ["torch.distributed", *collectives_for("all_reduce")]
    checked: list[str] = []
    for name in names:
        for dtype in DTYPES:
            for n in LENGTHS:
                try:
                    t = data(rank, n, dtype)
                    if name == "torch.distributed":
                        dist.all_reduce(t)
                    else:
                        collective(name).all_reduce(t, "sum")
                    want = sum(data(r, n, dtype) for r in range(world))
                    expect(torch.equal(t, want), f"{name} all_reduce {dtype} n={n} is wrong")
                except Exception:
                    expect(
                        False, f"{name} all_reduce {dtype} n={n} raised:\n{traceback.format_exc()}"
                    )
        checked.append(name)

    hierarchical: dict[str, object] = {"registered": "hierarchical" in COLLECTIVES}
    if "hierarchical" in COLLECTIVES:
        # Built as its docstring says: nodes of the launcher's LOCAL_WORLD_SIZE, given to it.
        coll = Hierarchical(ranks_per_node=ranks_per_node)
        hierarchical["ranks_per_node"] = coll.nodes_of(world)
        for n in LENGTHS:
            t = data(rank, n, torch.int64)
            coll.all_reduce(t, "sum")
            want = sum(data(r, n, torch.int64) for r in range(world))
            expect(torch.equal(t, want), f"constructed hierarchical all_reduce n={n} is wrong")
        if "broadcast" in coll.kinds:
            for root in range(world):
                t = data(rank, 1001, torch.int64)
                coll.broadcast(t, root)
                expect(torch.equal(t, data(root, 1001, torch.int64)), f"broadcast root={root}")
        checked.append("hierarchical (constructed)")

    # Bytes each node sent over its link for one large all-reduce: this is what the hierarchical
    # algorithm saves (ring: 2(P-1)/P * n per node; hierarchical: 2(N-1)/N * n).
    cross_node: dict[str, int] = {}
    for name in ("ring", "hierarchical", "torch.distributed"):
        if name != "torch.distributed" and name not in COLLECTIVES:
            continue
        t = data(rank, BIG, torch.float32)
        if name == "torch.distributed":
            cross_node[name] = node_tx(lambda t=t: dist.all_reduce(t))
        else:
            coll_ = collective(name)
            cross_node[name] = node_tx(lambda t=t, c=coll_: c.all_reduce(t, "sum"))

    per_rank: list[object] = [None] * world
    dist.all_gather_object(per_rank, {"failures": failures, "cross_node_bytes": cross_node})
    if rank == 0:
        result = {
            "world_size": world,
            "placements": placements,
            "checked": checked,
            "hierarchical": hierarchical,
            "per_rank": per_rank,
            "big_elements": BIG,
            "calibration_host": calibration.host,  # whose calibration "auto" chose by
        }
        out.write_text(json.dumps(result, indent=1))
    shut_down_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
