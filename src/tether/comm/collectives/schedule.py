"""Collectives as data: a schedule of point-to-point steps, its alpha-beta-gamma cost, a simulator.

Every algorithm in this package is one :class:`Schedule`: the executor
in :mod:`tether.comm.collectives.base` runs it over torch.distributed, :func:`cost` prices it and
:func:`simulate` runs it on plain tensors, so tests, the cost model and the simulator share one
definition (:func:`shared_core_cost` prices it on a node whose CPUs move the bytes).

Semantics. The flat vector of ``n`` elements is split into ``chunks`` nearly equal contiguous
chunks (the first ``n % chunks`` one element longer, as :func:`torch.tensor_split`). A
``Step(round, src, dst, chunk, op)`` sends ``src``'s copy of the chunk(s) to ``dst``, which
overwrites (``copy``) or combines (``reduce``) its own copy. Within a round every send reads the
value at the start of the round. In each round a rank sends at most one message and receives at
most one (the single-port, full-duplex model of Thakur, Rabenseifner and Gropp 2005,
"Optimization of collective communication operations in MPICH"), so the cost of a round is that
of its most expensive step: ``a + m*b`` plus ``m*g`` for a reduction of ``m`` bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch

from tether.comm.chunks import chunk_bounds

StepOp = Literal["copy", "reduce"]


@dataclass(frozen=True)
class Step:
    """In round ``round``, ``src`` sends chunk ``chunk`` (an index, or a tuple of consecutive
    indices sent as one message) to ``dst``, which copies it or reduces it into its own."""

    round: int
    src: int
    dst: int
    chunk: int | tuple[int, ...]
    op: StepOp

    @property
    def indices(self) -> tuple[int, ...]:
        return (self.chunk,) if isinstance(self.chunk, int) else self.chunk


def whole_vector(chunks: int) -> int | tuple[int, ...]:
    """The ``chunk`` of a step that sends the whole vector of a schedule of ``chunks`` chunks."""
    return 0 if chunks == 1 else tuple(range(chunks))


@dataclass(frozen=True)
class Schedule:
    """A collective algorithm as data: ``steps`` over ``world_size`` ranks and ``chunks`` chunks.

    ``root`` is the source of a broadcast or the destination of a reduce (None for all-reduce).
    """

    name: str
    world_size: int
    steps: tuple[Step, ...]
    chunks: int = 1
    root: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_rounds(self) -> int:
        return 1 + max((s.round for s in self.steps), default=-1)

    @cached_property
    def by_round(self) -> tuple[tuple[Step, ...], ...]:
        rounds: list[list[Step]] = [[] for _ in range(self.num_rounds)]
        for step in self.steps:
            rounds[step.round].append(step)
        return tuple(tuple(r) for r in rounds)

    def links(self) -> set[tuple[int, int]]:
        """The directed links ``(src, dst)`` the schedule uses."""
        return {(s.src, s.dst) for s in self.steps}

    def step_elements(self, step: Step, n: int) -> int:
        bounds = chunk_bounds(n, self.chunks)
        return sum(bounds[i][1] - bounds[i][0] for i in step.indices)

    def elements_sent(self, n: int) -> list[int]:
        """Elements each rank sends for a vector of ``n`` elements (exact chunk rounding)."""
        sent = [0] * self.world_size
        for step in self.steps:
            sent[step.src] += self.step_elements(step, n)
        return sent

    def bytes_sent(self, n: int, element_size: int) -> list[int]:
        """Bytes each rank sends for a vector of ``n`` elements of ``element_size`` bytes."""
        return [e * element_size for e in self.elements_sent(n)]

    def validate(self) -> None:
        for r, steps in enumerate(self.by_round):
            senders = [s.src for s in steps]
            receivers = [s.dst for s in steps]
            assert len(set(senders)) == len(senders), f"{self.name}: round {r} sends twice"
            assert len(set(receivers)) == len(receivers), f"{self.name}: round {r} receives twice"
            sent = {s.src: set(s.indices) for s in steps}
            for s in steps:
                ids = s.indices
                assert 0 <= s.src < self.world_size and 0 <= s.dst < self.world_size
                assert s.src != s.dst and s.round >= 0 and s.op in ("copy", "reduce")
                assert ids and list(ids) == list(range(ids[0], ids[0] + len(ids)))
                assert ids[0] >= 0 and ids[-1] < self.chunks, f"{self.name}: chunk out of range"
                # a copy received into a chunk the receiver is sending would race with the send
                assert s.op == "reduce" or not sent.get(s.dst, set()) & set(ids)


@dataclass(frozen=True)
class NodeLinks:
    """Two link levels for :func:`cost`: ranks ``node*ranks_per_node ...`` share a node, whose
    ONE link to the network (a NIC; a veth on emulated nodes) carries every byte its ranks send
    to or receive from other nodes, at ``alpha + m*beta`` instead of the intra-node parameters."""

    ranks_per_node: int
    alpha: float
    beta: float


def cost(
    schedule: Schedule,
    n_bytes: float,
    alpha: float,
    beta: float,
    gamma: float,
    inter: NodeLinks | None = None,
) -> float:
    """Alpha-beta-gamma time of ``schedule`` for a vector of ``n_bytes`` bytes (seconds if the
    parameters are): each round costs its most expensive step, chunks are ``n/chunks`` bytes
    exactly (no rounding), so the result is the closed form (docs/communication.md).

    With ``inter``, steps between nodes use its alpha and beta, and the steps of one round that
    leave (or enter) the same node share its link: they cost ``alpha + (sum of their bytes)*beta``
    together. Without that a hierarchical schedule, whose G ranks per node all cross at once,
    would be priced as if each rank had a link of its own."""
    total = 0.0
    for steps in schedule.by_round:
        worst = 0.0
        leaving: dict[int, float] = {}
        entering: dict[int, float] = {}
        for s in steps:
            m = n_bytes * len(s.indices) / schedule.chunks
            reduce = m * gamma if s.op == "reduce" else 0.0
            if inter is not None and s.src // inter.ranks_per_node != s.dst // inter.ranks_per_node:
                src, dst = s.src // inter.ranks_per_node, s.dst // inter.ranks_per_node
                leaving[src] = leaving.get(src, 0.0) + m
                entering[dst] = entering.get(dst, 0.0) + m
                worst = max(worst, inter.alpha + m * inter.beta + reduce)
            else:
                worst = max(worst, alpha + m * beta + reduce)
        if inter is not None:
            for shared in (*leaving.values(), *entering.values()):
                worst = max(worst, inter.alpha + shared * inter.beta)
        total += worst
    return total


def shared_core_cost(
    schedule: Schedule,
    n_bytes: float,
    alpha: float,
    beta: float,
    gamma: float,
    cores: int,
    one_way_alpha: float | None = None,
) -> float:
    """Time of ``schedule`` on one node whose ``cores`` CPUs move every byte (loopback TCP or
    shared memory: no wire, the kernel copies each message out of the sender and into the
    receiver): each end of a message costs ``m*beta/2`` of its rank's CPU (so a round in which
    every rank sends and receives ``m`` costs ``a + m*b``, the single-port model's price, and
    ``beta`` keeps its meaning), a reduction ``m*gamma``; a round takes its busiest rank's work
    or, with more active ranks than cores, their total work over the cores, and its start-up
    ``alpha`` stretches by the same ``active/cores``. A rank that only sends or only receives in
    a round therefore pays half the single-port price: what makes a tree's rounds as cheap as a
    ring's per byte on such a node (docs/communication.md). ``one_way_alpha``, where given, is
    the start-up of a round in which no rank both sends and receives (a tree's), ``alpha`` then
    that of a round of exchanges (a ring's): on shared cores they differ
    (:mod:`tether.comm.calibration.round_fit`)."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, not {cores}")
    total = 0.0
    for steps in schedule.by_round:
        work: dict[int, float] = {}
        for s in steps:
            m = n_bytes * len(s.indices) / schedule.chunks
            work[s.src] = work.get(s.src, 0.0) + m * beta / 2
            reduce = m * gamma if s.op == "reduce" else 0.0
            work[s.dst] = work.get(s.dst, 0.0) + m * beta / 2 + reduce
        if not work:
            continue
        exchanges = bool({s.src for s in steps} & {s.dst for s in steps})
        start = alpha if exchanges or one_way_alpha is None else one_way_alpha
        stretch = max(1.0, len(work) / cores)
        total += start * stretch + max(max(work.values()), sum(work.values()) / cores)
    return total


def simulate(
    schedule: Schedule,
    inputs: Sequence[torch.Tensor],
    combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.add,
) -> list[torch.Tensor]:
    """Run ``schedule`` on one flat tensor per rank in this process; returns the final tensors.

    The reference semantics of a schedule (sends read start-of-round values), used by unit tests
    and by the simulator."""
    assert len(inputs) == schedule.world_size
    state = [t.clone() for t in inputs]
    bounds = chunk_bounds(inputs[0].numel(), schedule.chunks)
    for steps in schedule.by_round:
        snapshot = [t.clone() for t in state]
        for s in steps:
            lo, hi = bounds[s.indices[0]][0], bounds[s.indices[-1]][1]
            incoming = snapshot[s.src][lo:hi]
            target = state[s.dst][lo:hi]
            target.copy_(incoming if s.op == "copy" else combine(target, incoming))
    return state
