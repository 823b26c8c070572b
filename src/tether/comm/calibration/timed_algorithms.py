"""Every candidate collective timed side by side on the running group, and what counts as a
clear win over native: the measurements ``auto`` chooses by (a
:class:`~tether.comm.calibration.model.Calibration` keeps them with the alpha-beta-gamma model
and decides per message size).

At each timed size the algorithms run in interleaved rounds (round 1 of every algorithm, then
round 2, ...; :func:`tether.comm.calibration.rounds.rotated` order), so that a slow spell of the
machine hits them alike and each round pairs every algorithm with native under the same
conditions.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping
from functools import partial

import torch

from tether.comm.calibration.rounds import iters_for, rotated
from tether.comm.collectives.base import Collective
from tether.comm.collectives.chain import Chain
from tether.comm.collectives.hierarchical import Hierarchical
from tether.comm.collectives.registry import COLLECTIVES, collectives_for
from tether.comm.transport import Transport

# Bytes at which the algorithms are timed: every power of 8 from 4 B (auto leaves native only
# where it has evidence at the timed sizes either side of a message, so they are close), and
# one float32 per rank (:func:`timed_sizes`).
TIMED_SIZES = tuple(4 * 8**k for k in range(8))  # 4 B .. 8 MiB
# Timed rounds per size: MIN_ROUNDS of every algorithm, then, for those whose median beats
# native's by MARGIN so far (the contenders) and native, as many more as fit in ROUND_BUDGET_S,
# up to MAX_ROUNDS in all. Where nothing contends (most sizes; every size on MPI) the size costs
# MIN_ROUNDS; where something does, its rounds no longer carry the slow algorithms (2 ranks,
# small messages: ring and halving-doubling at 2-3 ms a call left room for 5-6 rounds in 0.6 s).
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
    names = [n for n in collectives_for(kind) if n != "auto"]
    if ranks_per_node is not None and ranks_per_node >= world_size:
        names = [n for n in names if n != "hierarchical"]
    return names


def instantiate(algorithm: str, alpha: float, beta: float, ranks_per_node: int) -> Collective:
    """The registered algorithm with measured parameters (chain chunks, hierarchical nodes)."""
    collective = COLLECTIVES.get(algorithm)
    if isinstance(collective, Chain) and collective.chunks is None and alpha > 0:
        return dataclasses.replace(collective, alpha=alpha, beta=beta)
    if isinstance(collective, Hierarchical) and collective.ranks_per_node is None:
        return Hierarchical(ranks_per_node=ranks_per_node)
    return collective


def time_algorithms(
    transport: Transport, kind: str, alpha: float, beta: float, ranks_per_node: int
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[float]]]:
    """Every candidate algorithm's time per call (the median over its rounds of the slowest
    rank's time: :data:`MIN_ROUNDS`, up to :data:`MAX_ROUNDS` for contenders) at each of
    :func:`timed_sizes` up to the first where a call takes :data:`SLOW_CALL_S`, and the sizes
    where each beat native clearly (:func:`beats_clearly`).

    At each size the rounds are interleaved across the algorithms (round 1 of every algorithm,
    then round 2, ...; each round in a rotated order), so a slow spell of the machine hits them
    alike and each round pairs every algorithm with native under the same conditions. A round
    is a barrier and then :func:`~tether.comm.calibration.rounds.iters_for` calls back to back, as
    in ``tether bench comm`` (why: :mod:`tether.comm.calibration.rounds`), after an untimed call
    of the same algorithm, which absorbs what the previous one left behind (see
    :mod:`tether.bench.comm_measure`): at every size, as the benchmark does (skipping it from
    1 MiB, as calibrations before v7 did, timed 2-rank 1 MiB calls in another regime: a
    barrier alone before an exchange-based call is kinder to it than a call of its own). Every
    rank sees the same (all-reduced) times, so all stop at the same size."""
    names = candidates(kind, ranks_per_node, transport.world_size)
    algorithms = {name: instantiate(name, alpha, beta, ranks_per_node) for name in names}
    points: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    clear_wins: dict[str, list[float]] = {name: [] for name in names if name != "native"}
    for n_bytes in timed_sizes(transport.world_size):
        buf = torch.zeros(max(1, n_bytes // 4), dtype=torch.float32)
        calls = {name: partial(algorithms[name].run, kind, buf, comm=transport) for name in names}
        timer = partial(_timed_rounds, calls, transport, n_bytes)
        # every algorithm, after an untimed round that sets up connections and buffers
        samples, spent = timer(names, MIN_ROUNDS + 1)
        samples = {name: times[1:] for name, times in samples.items()}
        # then more rounds for those that may beat native clearly, as many as fit the budget
        ahead = contenders(samples) if "native" in samples else []
        if ahead:
            timed = [*ahead, "native"]
            round_s = sum(spent[name] for name in timed) / (MIN_ROUNDS + 1)
            extra = min(MAX_ROUNDS - MIN_ROUNDS, int(ROUND_BUDGET_S // max(round_s, 1e-9)))
            if extra:
                more, _ = timer(timed, extra, MIN_ROUNDS + 1)
                for name in timed:
                    samples[name] += more[name]
        for name in names:
            points[name].append((float(n_bytes), statistics.median(samples[name])))
        for name in ahead:
            if beats_clearly(samples[name], samples["native"]):
                clear_wins[name].append(float(n_bytes))
        if max(p[-1][1] for p in points.values()) > SLOW_CALL_S:
            break
    return points, clear_wins


def _timed_rounds(
    calls: Mapping[str, Callable[[], None]],
    transport: Transport,
    n_bytes: int,
    names: list[str],
    rounds: int,
    first_round: int = 0,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """``rounds`` interleaved rounds of ``names`` (the order rotated from round to round,
    counting from ``first_round``): per algorithm, the slowest rank's time per call in each
    round, and the slowest rank's wall time spent on it in all (untimed call and barrier
    included). One all-reduce for all: a collective ends when its last rank does."""
    iters = iters_for(n_bytes)  # as tether bench comm times a repeat, by which auto is judged
    mine: dict[str, list[float]] = {name: [] for name in names}
    spent = dict.fromkeys(names, 0.0)
    for round_ in range(first_round, first_round + rounds):
        for name in rotated(names, round_):
            call, began = calls[name], time.perf_counter()
            call()
            transport.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                call()
            now = time.perf_counter()
            mine[name].append((now - start) / iters)
            spent[name] += now - began
    slowest = torch.tensor([[*mine[name], spent[name]] for name in names], dtype=torch.float64)
    transport.all_reduce(slowest, "max")
    rows = {name: [float(t) for t in row] for name, row in zip(names, slowest, strict=True)}
    return {name: row[:-1] for name, row in rows.items()}, {n: r[-1] for n, r in rows.items()}


def contenders(samples: dict[str, list[float]]) -> list[str]:
    """The algorithms whose median so far beats native's by :data:`MARGIN`: the only ones that
    may turn out clear wins, so the only ones timed further."""
    native = samples["native"]
    return [n for n, t in samples.items() if n != "native" and _median_ahead(t, native)]


def _median_ahead(times: list[float], native: list[float]) -> bool:
    """Whether the median of ``times`` is at least :data:`MARGIN` under native's."""
    return statistics.median(times) <= statistics.median(native) * (1 - MARGIN)


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
    return _median_ahead(times, native) and wins >= needed
