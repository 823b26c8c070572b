"""Every candidate collective timed side by side on the running group, and what counts as a
clear win over native: the measurements ``auto`` chooses by (:mod:`tether.perf.calibration`
keeps them with the alpha-beta-gamma model and decides per message size).

At each timed size the algorithms run in interleaved rounds (round 1 of every algorithm, then
round 2, ...; :func:`tether.perf.rounds.rotated` order), so that a slow spell of the machine hits
them alike and each round pairs every algorithm with native under the same conditions.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from functools import partial
from typing import TYPE_CHECKING

import torch

from tether.comm.transport import Transport
from tether.perf.rounds import rotated

if TYPE_CHECKING:
    from tether.comm.collectives.base import Collective

# Bytes at which the algorithms are timed: every power of 8 from 4 B (auto leaves native only
# where it has evidence at the timed sizes either side of a message, so they are close), with
# 4 B and 32 B either side of where gloo's all-reduce switches algorithm (fewer elements than
# ranks: 4 B on 4 ranks ran 5x faster than 16 B).
TIMED_SIZES = tuple(4 * 8**k for k in range(8))  # 4 B .. 8 MiB
LARGE_BYTES = 1 << 20  # from here on fewer rounds, and no untimed call before each
ROUNDS = 9  # timed rounds per algorithm below LARGE_BYTES...
LARGE_ROUNDS = 5  # ...and from LARGE_BYTES (a call there takes milliseconds, noise is relative)
# auto leaves native only for an algorithm measured this much faster (noise is not a reason)...
MARGIN = 0.2
# ...in its median AND in nearly all of the interleaved rounds, each compared with native's time
# in the same round: ROUND_WINS[rounds] of them (a sign test: by chance alone, 8 or more of 9
# has odds of 2%, 5 of 5 of 3%).
# On 2 ranks here the same code timed twice differed by up to 2x in the median, so a median
# alone let noise pick algorithms that then ran 0.5x-0.8x native.
ROUND_WINS = {ROUNDS: 8, LARGE_ROUNDS: LARGE_ROUNDS}
# Larger sizes are not timed once one call takes this long (a slow network): the times beyond
# are extrapolated in proportion to the size, and the calibration stays a few seconds.
SLOW_CALL_S = 0.05


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
    """Every candidate algorithm's time per call (the median over :data:`ROUNDS` rounds, or
    :data:`LARGE_ROUNDS`, of the slowest rank's time) at each of :data:`TIMED_SIZES` up to the
    first where a call takes :data:`SLOW_CALL_S`, and the sizes where each beat native clearly
    (:func:`beats_clearly`).

    At each size the rounds are interleaved across the algorithms (round 1 of every algorithm,
    then round 2, ...; each round in a rotated order), so a slow spell of the machine hits them
    alike and each round pairs every algorithm with native under the same conditions. Below
    :data:`LARGE_BYTES` each timed call follows an untimed one, which absorbs what the previous
    algorithm left behind (see :mod:`tether.bench.comm_measure`). Every rank sees the same
    (all-reduced) times, so all stop at the same size."""
    names = candidates(kind, ranks_per_node, transport.world_size)
    algorithms = {name: instantiate(name, alpha, beta, ranks_per_node) for name in names}
    points: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    clear_wins: dict[str, list[float]] = {name: [] for name in names if name != "native"}
    for n_bytes in TIMED_SIZES:
        buf = torch.zeros(max(1, n_bytes // 4), dtype=torch.float32)
        rounds = ROUNDS if n_bytes < LARGE_BYTES else LARGE_ROUNDS
        mine: dict[str, list[float]] = {name: [] for name in names}
        calls = {name: partial(algorithms[name].run, kind, buf, comm=transport) for name in names}
        for round_ in range(rounds + 1):  # round 0 sets up connections and buffers, untimed
            for name in rotated(names, round_):
                call = calls[name]
                if n_bytes < LARGE_BYTES:
                    call()
                transport.barrier()
                start = time.perf_counter()
                call()
                mine[name].append(time.perf_counter() - start)
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


def beats_clearly(times: list[float], native: list[float]) -> bool:
    """Whether an algorithm's per-round times beat native's of the same rounds clearly: the
    median faster by :data:`MARGIN`, and faster in :data:`ROUND_WINS` of the rounds."""
    wins = sum(t < n for t, n in zip(times, native, strict=True))
    needed = ROUND_WINS.get(len(times), len(times))
    return statistics.median(times) <= statistics.median(native) * (1 - MARGIN) and wins >= needed
