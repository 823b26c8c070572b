"""The time of one collective in the alpha-beta-gamma model, in closed form, for any group size.

The collectives of :mod:`tether.comm.collectives` are schedules (data) whose priced rounds are the
definition of each algorithm's cost; the formulas here are those schedules' costs summed in closed
form (tests/unit/test_perf_formulas.py checks them against the schedules round by round for every
group size up to 16), so that 4096 ranks cost a formula instead of 33 million steps:

* ring all-reduce (Patarasuk and Yuan 2009): ``2(P-1)a + 2(P-1)/P*n*b + (P-1)/P*n*g``;
* recursive halving-doubling (Rabenseifner; Thakur et al. 2005), P' = the largest power of two
  <= P, the P - P' extra ranks folded in first and out last:
  ``2 log2(P') a + 2(P'-1)/P'*n*b + (P'-1)/P'*n*g [+ (a + n*b + n*g) + (a + n*b)]``;
* recursive doubling: ``log2(P')(a + n*b + n*g)`` plus the same fold;
* binomial tree: reduce ``ceil(log2 P)(a + n*b + n*g)`` then broadcast ``ceil(log2 P)(a + n*b)``;
* naive (reduce to a root, then broadcast from it, one peer at a time):
  ``(P-1)(a + n*b + n*g) + (P-1)(a + n*b)``;
* hierarchical (Jia et al. 2018): ring reduce-scatter inside each node of G ranks, a ring
  all-reduce of 1/G of the vector among the N nodes, ring all-gather inside the node; the G ranks
  of a node cross its one link together, so each cross round costs ``A + n/N*B`` on the node link.

Time is in seconds when the links are (``a`` s/message, ``b`` s/byte, ``g`` s/byte reduced).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tether.perf.shared_core_cost import shared_core_all_reduce

ALL_REDUCE_ALGORITHMS = (
    "ring",
    "halving-doubling",
    "recursive-doubling",
    "binomial",
    "naive",
    "hierarchical",
)


@dataclass(frozen=True)
class Links:
    """The alpha-beta-gamma parameters a collective is priced with: ``a``, ``b`` inside a node,
    ``inter_a``, ``inter_b`` on a node's one link to the others, ``g`` per byte reduced;
    ``ranks_per_node`` ranks share a node (consecutive ranks, as launchers place them);
    ``a_load`` is what a collective's message costs more in training than on idle ranks, on
    either link, and ``service_load`` a parameter server's CPU per exchange beyond its priced
    apply (:mod:`tether.perf.exchange_load`); ``shared_cores``, where set, the CPUs of a node
    whose ranks move their bytes with them instead of over links of their own (loopback TCP,
    shared memory: :mod:`tether.perf.shared_core_cost`), on one node, where a round of one-way
    messages starts in ``one_way_a`` if measured apart (else ``a``)."""

    a: float
    b: float
    g: float
    inter_a: float
    inter_b: float
    ranks_per_node: int
    server_wire: tuple[float, float] | None = None  # (a, b) of a server's messages in a node
    a_load: float = 0.0
    service_load: float = 0.0
    shared_cores: int = 0
    one_way_a: float | None = None

    def nodes(self, world: int) -> int:
        return math.ceil(world / max(1, self.ranks_per_node))


def _fold(a: float, b: float, g: float, n: float, world: int) -> float:
    """The extra ranks of a non-power-of-two group: one reduce in, one copy out."""
    p2 = 1 << (world.bit_length() - 1)
    return 0.0 if world == p2 else (a + n * b + n * g) + (a + n * b)


def _flat(algorithm: str, world: int, n: float, a: float, b: float, g: float) -> float:
    p = world
    if algorithm == "ring":
        return 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g
    p2 = 1 << (p.bit_length() - 1)
    if algorithm == "halving-doubling":
        inner = 2 * math.log2(p2) * a + 2 * (p2 - 1) / p2 * n * b + (p2 - 1) / p2 * n * g
        return inner + _fold(a, b, g, n, p)
    if algorithm == "recursive-doubling":
        return math.log2(p2) * (a + n * b + n * g) + _fold(a, b, g, n, p)
    if algorithm == "binomial":
        rounds = math.ceil(math.log2(p))
        return rounds * (a + n * b + n * g) + rounds * (a + n * b)
    if algorithm == "naive":
        return (p - 1) * (a + n * b + n * g) + (p - 1) * (a + n * b)
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}: one of {ALL_REDUCE_ALGORITHMS}")


def all_reduce_time(algorithm: str, world: int, n_bytes: float, links: Links) -> float:
    """Seconds of one all-reduce of ``n_bytes`` over ``world`` ranks.

    On one node every step uses the intra-node link. Across nodes, a flat algorithm's rounds
    have steps on both links at once (some cross nodes in every round), so each is priced at the
    slower of the two; the hierarchical algorithm crosses only in its middle phase. ``native``
    is priced as the ring (gloo's and NCCL's large-message all-reduce is a ring); a measured
    time is better where there is one."""
    if world < 2 or n_bytes <= 0:
        return 0.0
    if algorithm == "auto":  # a run picks the fastest for each size: priced as the fastest here
        return best_all_reduce(world, n_bytes, links)[1]
    a, b, g = links.a + links.a_load, links.b, links.g
    inter_a = links.inter_a + links.a_load
    nodes = links.nodes(world)
    if links.shared_cores and nodes == 1:
        a1 = None if links.one_way_a is None else links.one_way_a + links.a_load
        return shared_core_all_reduce(algorithm, world, n_bytes, a, b, g, links.shared_cores, a1)
    if algorithm == "native":
        algorithm = "ring"
    if algorithm == "hierarchical" and nodes > 1:
        per_node = min(world, links.ranks_per_node)
        inside = 2 * (per_node - 1) * a + (per_node - 1) / per_node * n_bytes * (2 * b + g)
        piece = n_bytes / per_node
        # every local rank runs its own cross-node ring on 1/G of the vector; a node's link
        # carries all G of them at once
        cross_round = max(
            inter_a + piece / nodes * (links.inter_b + g),
            inter_a + per_node * piece / nodes * links.inter_b,
        )
        cross_copy = max(
            inter_a + piece / nodes * links.inter_b,
            inter_a + per_node * piece / nodes * links.inter_b,
        )
        return inside + (nodes - 1) * (cross_round + cross_copy)
    if algorithm == "hierarchical":
        algorithm = "ring"
    inside = _flat(algorithm, world, n_bytes, a, b, g)
    if nodes > 1:
        # a flat schedule over several nodes: each round has a step that crosses a node boundary
        # (the ring's last rank of a node sends to the next node's first) and steps inside the
        # nodes, all at once, so a round takes the slower of the two links (with consecutive
        # placement one step per node crosses per round); a node's link faster than its inside
        # (InfiniBand beside PCIe) makes no round faster than one node's
        return max(inside, _flat(algorithm, world, n_bytes, inter_a, links.inter_b, g))
    return inside


def message_time(n_bytes: float, links: Links, crosses_nodes: bool) -> float:
    """One point-to-point message (a parameter server's push or reply): on the server's own
    wire where the profile measured it, else on the collectives' link."""
    if crosses_nodes:
        return links.inter_a + n_bytes * links.inter_b
    if links.server_wire is not None:
        alpha, beta = links.server_wire
        return alpha + n_bytes * beta
    return links.a + n_bytes * links.b


def best_all_reduce(world: int, n_bytes: float, links: Links) -> tuple[str, float]:
    """The algorithm the model prices fastest for this size, and its time."""
    times = {name: all_reduce_time(name, world, n_bytes, links) for name in ALL_REDUCE_ALGORITHMS}
    name = min(times, key=lambda k: (times[k], k))
    return name, times[name]
