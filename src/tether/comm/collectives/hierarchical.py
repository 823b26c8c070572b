"""Hierarchical (two-level) all-reduce and broadcast for ranks grouped into nodes.

Jia et al. 2018 ("Highly scalable deep learning training system with mixed-precision":
the "hybrid" all-reduce) and Horovod's hierarchical all-reduce; docs/communication.md. Ranks
are grouped into N nodes of G consecutive ranks (rank = node*G + local rank, as torchrun and SLURM
place them); links inside a node are fast, links between nodes slow.

All-reduce, on ``G*N`` chunks (chunk ``c*N + j`` is sub-chunk j of node-level chunk c):

1. inside every node, a ring reduce-scatter over the G node-level chunks: local rank i ends
   holding node chunk ``(i + 1) mod G`` summed over its node (G-1 rounds, n/G bytes each);
2. across nodes, for every local index i at once, a ring all-reduce of node chunk ``(i+1) mod G``
   among the N ranks with local index i (2(N-1) rounds of n/(G*N) bytes);
3. inside every node, a ring all-gather of the node chunks (G-1 rounds).

Each rank sends ``2(N-1)/N * n/G`` bytes over the slow links instead of a flat ring's
``2(P-1)/P * n``, and a node's link carries ``2(N-1)/N * n`` instead of ``2(P-1)/P * n``: with
2 nodes of 2 ranks, 1.0n instead of 1.5n. With G = 1 this is the flat ring; with N = 1 the
intra-node ring.

Broadcast: a binomial tree among one rank per node (the root, and the ranks with the root's
local index elsewhere), then a binomial tree inside every node from that rank, so the message
crosses the slow links ``N - 1`` times in ``ceil(log2 N)`` rounds.

Node membership is ``ranks_per_node``, given by whoever knows the layout: the caller that
launched the ranks (the launcher's local world size, :func:`launch_node_size`) or the user
(``--ranks-per-node``, which also lets one machine emulate nodes). The collectives read no
environment; without a node size the whole group is one node (the intra-node ring), which is
correct anywhere, only not tuned to a multi-node layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial

from tether.comm.collectives.base import Collective
from tether.comm.collectives.binomial import binomial_broadcast
from tether.comm.collectives.ring import ring_all_reduce
from tether.comm.collectives.schedule import Schedule, Step
from tether.errors import TetherError


def embed(
    schedule: Schedule,
    members: Sequence[int],
    first_round: int,
    chunk_of: Callable[[int], tuple[int, ...]],
    rounds: range | None = None,
) -> list[Step]:
    """The steps of ``schedule`` (over ``len(members)`` ranks) as steps of the whole group:
    rank k becomes ``members[k]``, round r becomes ``first_round + r - rounds.start``, and chunk c
    becomes the consecutive chunks ``chunk_of(c)``. ``rounds`` selects a phase of the schedule."""
    rounds = rounds if rounds is not None else range(schedule.num_rounds)
    steps = []
    for s in schedule.steps:
        if s.round in rounds:
            chunks = tuple(c for i in s.indices for c in chunk_of(i))
            steps.append(
                Step(
                    first_round + s.round - rounds.start,
                    members[s.src],
                    members[s.dst],
                    chunks[0] if len(chunks) == 1 else chunks,
                    s.op,
                )
            )
    return steps


def _sub_chunk(node_chunk: int, n_nodes: int, j: int) -> tuple[int, ...]:
    return (node_chunk * n_nodes + j,)


def check_nodes(world_size: int, ranks_per_node: int) -> int:
    """The number of nodes; a user error if the ranks do not split into whole nodes."""
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise TetherError(
            f"hierarchical collectives need whole nodes: {world_size} ranks do not split into "
            f"nodes of {ranks_per_node}; set --ranks-per-node (ranks_per_node in Python) to a "
            f"divisor of {world_size}"
        )
    return world_size // ranks_per_node


def launch_node_size(world_size: int, local_world_size: int | None) -> int:
    """The ranks per node of a group of ``world_size`` ranks started ``local_world_size`` to a
    node (what a launcher reports as LOCAL_WORLD_SIZE; None where none says). Where that is
    unknown or does not split the group into whole nodes (a subgroup), the whole group is one
    node rather than a guessed split."""
    local = local_world_size
    if local is None or not 1 <= local <= world_size or world_size % local:
        return world_size
    return local


@lru_cache(maxsize=64)
def hierarchical_all_reduce(world_size: int, ranks_per_node: int) -> Schedule:
    g, n_nodes = ranks_per_node, check_nodes(world_size, ranks_per_node)
    nodes = [list(range(k * g, (k + 1) * g)) for k in range(n_nodes)]
    intra, inter = ring_all_reduce(g), ring_all_reduce(n_nodes)
    intra_half = g - 1  # rounds of the intra-node reduce-scatter (and of the all-gather)

    def node_chunk(c: int) -> tuple[int, ...]:
        return tuple(range(c * n_nodes, (c + 1) * n_nodes))

    steps: list[Step] = []
    for members in nodes:  # 1. reduce-scatter inside each node
        steps += embed(intra, members, 0, node_chunk, range(0, intra_half))
    for i in range(g):  # 2. one ring across nodes per local index, on that rank's node chunk
        owned = (i + 1) % g
        peers = [k * g + i for k in range(n_nodes)]
        steps += embed(inter, peers, intra_half, partial(_sub_chunk, owned, n_nodes))
    after = intra_half + inter.num_rounds
    for members in nodes:  # 3. all-gather inside each node
        steps += embed(intra, members, after, node_chunk, range(intra_half, 2 * intra_half))
    return Schedule("hierarchical", world_size, tuple(steps), chunks=g * n_nodes)


@lru_cache(maxsize=64)
def hierarchical_broadcast(world_size: int, ranks_per_node: int, root: int) -> Schedule:
    g, n_nodes = ranks_per_node, check_nodes(world_size, ranks_per_node)
    root_node, local = divmod(root, g)
    # Node k's entry rank has the root's local index; node-relative numbering puts the root's
    # node first so the tree over nodes is rooted there.
    entries = [k * g + local for k in range(n_nodes)]
    across = binomial_broadcast(n_nodes, root_node)
    steps = embed(across, entries, 0, lambda c: (c,))
    within = binomial_broadcast(g, local)
    for k in range(n_nodes):
        steps += embed(within, list(range(k * g, (k + 1) * g)), across.num_rounds, lambda c: (c,))
    return Schedule("hierarchical-broadcast", world_size, tuple(steps), root=root)


@dataclass(frozen=True)
class Hierarchical(Collective):
    """Two-level all-reduce and broadcast for nodes of G ranks (Jia et al. 2018; Horovod).

    All-reduce: intra-node reduce-scatter, inter-node rings, intra-node all-gather; broadcast:
    across nodes, then within."""

    name = "hierarchical"
    kinds = ("all_reduce", "broadcast")
    ranks_per_node: int | None = None  # None: the whole group is one node

    def nodes_of(self, world_size: int) -> int:
        """G, the ranks per node this collective uses for a group of ``world_size``."""
        return world_size if self.ranks_per_node is None else self.ranks_per_node

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        g = self.nodes_of(world_size)
        if kind == "all_reduce":
            return hierarchical_all_reduce(world_size, g)
        return hierarchical_broadcast(world_size, g, root)
