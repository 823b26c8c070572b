"""The all-reducer's node size is agreed by every rank (each knows only its own node's).

Nodes of different sizes (``srun -n 3 -N 2``: 2 ranks and 1) made the ranks build hierarchical
schedules that did not match, and every rank waited out the timeout blaming a live peer. Now
every rank refuses ``hierarchical`` in one line at once; an even layout builds as before.

Also here (a group costs seconds): an fp16 tensor on the fp16 wire is divided before the sum,
as any other tensor is, so a mean that fits in fp16 does not overflow on its way; the fp16
wire's documented edge; a collective averaging a parameter in place; an unknown wire format."""

from __future__ import annotations

import pytest
import torch

from tether.comm.collectives.registry import COLLECTIVES
from tether.comm.reducer import AllReducer
from tether.comm.transport import TorchTransport
from tether.errors import TetherError
from tether.launch.spawn import run_spawned

UNEVEN = [2, 2, 1]  # ranks 0-1 on one node, rank 2 alone on another


def _on_every_rank(rank: int, world: int) -> dict:
    out: dict = {}
    try:
        AllReducer(TorchTransport(), "hierarchical", ranks_per_node=UNEVEN[rank])
    except TetherError as exc:
        out["uneven"] = str(exc)
    reducer = AllReducer(TorchTransport(), "hierarchical", ranks_per_node=3)  # one node of 3
    tensor = torch.full((5,), float(rank))
    reducer.start(tensor, average=True).wait()
    out["mean"] = tensor.tolist()
    reducer.close()
    fp16 = AllReducer(TorchTransport(), "native", "fp16")
    big = torch.full((4,), 40000.0, dtype=torch.float16)  # the sum of 3 overflows fp16
    fp16.start(big, average=True).wait()
    out["fp16"] = big.float().tolist()
    # fp32 on the fp16 wire: the documented edge (x / P rounds to nearest, up as well)
    edge = torch.tensor([65000.0, 65504.0])
    fp16.start(edge, average=False).wait()
    out["fp16_edge"] = edge.tolist()
    # a parameter averaged in place through a collective's own API (no autograd step)
    param = torch.nn.Parameter(torch.full((3,), float(rank)))
    COLLECTIVES.get("ring").all_reduce(param, "avg")
    out["param_avg"] = param.detach().tolist()
    try:
        AllReducer(TorchTransport(), "ring", "zfp")
    except TetherError as exc:
        out["wire"] = str(exc)
    return out


def test_uneven_nodes_are_refused_on_every_rank_at_once() -> None:
    ranks = run_spawned(_on_every_rank, 3, timeout_s=30)
    for rank in ranks:
        assert "needs the same number of ranks on every node" in rank["uneven"]
        assert "nodes hold 1 to 2" in rank["uneven"]
        assert rank["mean"] == pytest.approx([1.0] * 5)
        assert rank["fp16"] == pytest.approx([40000.0] * 4, rel=1e-2)  # was inf
        assert rank["fp16_edge"][0] == pytest.approx(3 * 65000.0, rel=1e-3)
        assert rank["fp16_edge"][1] == float("inf")  # as docs/communication.md says
        assert rank["param_avg"] == [1.0, 1.0, 1.0]  # raised: an in-place op on a leaf
        assert rank["wire"] == "unknown all-reduce wire format 'zfp'; valid: none, fp16, bf16"
