"""Every candidate collective timed side by side on the running group, and what counts as a
clear win over native: the measurements ``auto`` chooses by (:mod:`tether.perf.calibration`
keeps them with the alpha-beta-gamma model and decides per message size).

At each timed size the algorithms run in interleaved rounds (round 1 of every algorithm, then
round 2, ...; :func:`tether.perf.rounds.rotated` order), so that a slow spell of the machine hits
them alike and each round pairs every algorithm with native under the same conditions.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from functools import partial
from typing import TYPE_CHECKING

import torch

from tether.comm.transport import Transport
from tether.perf.rounds import iters_for, rotated

if TYPE_CHECKING:
    from tether.comm.collectives.base import Collective

# Bytes at which the algorithms are timed: every power of 8 from 4 B (auto leaves native only
# where it has evidence at the timed sizes either side of a message, so they are close), and
# one float32 per rank (:func:`timed_sizes`).
TIMED_SIZES = tuple(4 * 8**k for k in range(8))  # 4 B .. 8 MiB
LARGE_BYTES = 1 << 20  # from here on no untimed call before each timed round
# Timed rounds per algorithm and size: as many as fit in ROUND_BUDGET_S (many for cheap small
# calls on few ranks, where the noise is worst), within MIN_ROUNDS..MAX_ROUNDS.
MIN_ROUNDS = 5
MAX_ROUNDS = 25
ROUND_BUDGET_S = 0.6
# auto leaves native only for an algorithm measured this much faster (noise is not a reason)...
MARGIN = 0.2
# ...in its median AND in nearly all of the interleaved rounds, each compared with native's time
# in the same round: as many as a one-sided sign test at this level asks (:func:`wins_needed`: 5
# of 5, 8 of 9, 18 of 25; by chance alone each has odds of 3% or less). On 2 ranks here the
# same code timed twice differed by up to 2x in the median, so a median alone let noise pick
# algorithms that then ran 0.5x-0.8x native; but with 9 rounds real wins were missed: 2 ranks,
# 32 B to 2 KiB, the binomial tree 2-4x faster than gloo's all-reduce in the median won 15-19
# of 19 rounds, and 8 of 9 holds for a true win rate of 85% only 60% of the time (25 rounds
# and 18 wins: 96%).
SIGN_TEST_LEVEL = 1 / 32
# Larger sizes are not timed once one call takes this long (a slow network): the times beyond
# are extrapolated in proportion to the size, and the calibration stays a few seconds.
SLOW_CALL_S = 0.05


def timed_sizes(world_size: int) -> list[int]:
    """:data:`TIMED_SIZES` and ``4 * world_size`` bytes, the smallest message that gives every
    rank an element: below it the algorithms that cut the vector into one chunk per rank, gloo's
    all-reduce among them, move less (4 ranks, gloo: 4 B ran 5x faster than 16 B), so the
    curves cross there, and without a timed point at the crossing the evidence for a size just
    above (which must hold at the timed sizes on both sides) came from the other regime: 4
    ranks at 16 B kept native at 3.1 ms while the naive algorithm took 0.8."""
    return sorted({*TIMED_SIZES, 4 * world_size})


def candidates(kind: str, ranks_per_node: int | None = None, world_size: int = 0) -> list[str]:
    """The algorithms ``auto`` chooses among for ``kind``: every registered one but itself (the
    naive oracle included: with more ranks than cores its few dependent rounds can win), and
    hierarchical only where the group spans several nodes (on one node it is the ring)."""
    from tether.comm.collectives.registry import collectives_for

    names = [n for n in collectives_for(kind) if n != "auto"]
    if ranks_per_node is not None and ranks_per_node >= world_size:
        names = [n for n in names if n != "hierarchical"]
    return names


def instantiate(algorithm: str, alpha: float, beta: float, ranks_per_node: int) -> Collective:
    """The registered algorithm with measured parameters (chain chunks, hierarchical nodes)."""
    from tether.comm.collectives.chain import Chain
    from tether.comm.collectives.hierarchical import Hierarchical
    from tether.comm.collectives.registry import COLLECTIVES

    collective = COLLECTIVES.get(algorithm)
    if isinstance(collective, Chain) and collective.chunks is None and alpha > 0:
        return dataclasses.replace(collective, alpha=alpha, beta=beta)
    if isinstance(collective, Hierarchical) and collective.ranks_per_node is None:
        return Hierarchical(ranks_per_node=ranks_per_node)
    return collective


def time_algorithms(
    transport: Transport, kind: str, alpha: float, beta: float, ranks_per_node: int
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[float]]]:
    """Every candidate algorithm's time per call (the median over the rounds, 5 to 25 of them
    (:func:`_rounds_that_fit`), of the slowest rank's time) at each of :func:`timed_sizes` up to the
    first where a call takes :data:`SLOW_CALL_S`, and the sizes where each beat native clearly
    (:func:`beats_clearly`).

    At each size the rounds are interleaved across the algorithms (round 1 of every algorithm,
    then round 2, ...; each round in a rotated order), so a slow spell of the machine hits them
    alike and each round pairs every algorithm with native under the same conditions. A round
    is a barrier and then :func:`~tether.perf.rounds.iters_for` calls back to back, as in
    ``tether bench comm`` (why: :mod:`tether.perf.rounds`). Below
    :data:`LARGE_BYTES` each timed call follows an untimed one, which absorbs what the previous
    algorithm left behind (see :mod:`tether.bench.comm_measure`). Every rank sees the same
    (all-reduced) times, so all stop at the same size."""
    names = candidates(kind, ranks_per_node, transport.world_size)
    algorithms = {name: instantiate(name, alpha, beta, ranks_per_node) for name in names}
    points: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    clear_wins: dict[str, list[float]] = {name: [] for name in names if name != "native"}
    for n_bytes in timed_sizes(transport.world_size):
        buf = torch.zeros(max(1, n_bytes // 4), dtype=torch.float32)
        mine: dict[str, list[float]] = {name: [] for name in names}
        calls = {name: partial(algorithms[name].run, kind, buf, comm=transport) for name in names}
        iters = iters_for(n_bytes)  # as tether bench comm times a repeat, by which auto is judged
        rounds, round_ = MIN_ROUNDS, 0
        while round_ <= rounds:  # round 0 sets up connections and buffers, untimed
            began = time.perf_counter()
            for name in rotated(names, round_):
                call = calls[name]
                if n_bytes < LARGE_BYTES:
                    call()
                transport.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    call()
                mine[name].append((time.perf_counter() - start) / iters)
            if round_ == 1:  # the first timed round tells how many fit in the budget
                rounds = _rounds_that_fit(time.perf_counter() - began, transport)
            round_ += 1
        # one all-reduce per size, not per call: a collective ends when its last rank does
        slowest = torch.tensor([mine[name][1:] for name in names], dtype=torch.float64)
        transport.all_reduce(slowest, "max")
        samples = {name: [float(t) for t in row] for name, row in zip(names, slowest, strict=True)}
        for name in names:
            points[name].append((float(n_bytes), statistics.median(samples[name])))
        if "native" in samples:
            for name in clear_wins:
                if beats_clearly(samples[name], samples["native"]):
                    clear_wins[name].append(float(n_bytes))
        if max(p[-1][1] for p in points.values()) > SLOW_CALL_S:
            break
    return points, clear_wins


def _rounds_that_fit(round_s: float, transport: Transport) -> int:
    """Timed rounds for a size whose first timed round took ``round_s`` on this rank: as many as
    fit in :data:`ROUND_BUDGET_S` on the slowest rank (every rank must run the same number),
    within :data:`MIN_ROUNDS`..:data:`MAX_ROUNDS`."""
    slowest = torch.tensor([round_s], dtype=torch.float64)
    transport.all_reduce(slowest, "max")
    return int(min(MAX_ROUNDS, max(MIN_ROUNDS, ROUND_BUDGET_S // max(float(slowest), 1e-9))))


def wins_needed(rounds: int) -> int:
    """The fewest of ``rounds`` paired rounds an algorithm must win for a one-sided sign test at
    :data:`SIGN_TEST_LEVEL`: the smallest k with P(k or more wins | each round a coin flip)
    within the level."""
    tail = 0.0
    for k in range(rounds, 0, -1):
        tail += math.comb(rounds, k) / 2**rounds
        if tail > SIGN_TEST_LEVEL:
            return k + 1
    return 1


def beats_clearly(times: list[float], native: list[float]) -> bool:
    """Whether an algorithm's per-round times beat native's of the same rounds clearly: the
    median faster by :data:`MARGIN`, and faster in :func:`wins_needed` of the rounds."""
    wins = sum(t < n for t, n in zip(times, native, strict=True))
    needed = wins_needed(len(times))
    return statistics.median(times) <= statistics.median(native) * (1 - MARGIN) and wins >= needed
