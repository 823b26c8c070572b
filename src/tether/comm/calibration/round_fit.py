"""What a round of a schedule costs on the running group, fitted to the calibration's timed
algorithms.

A ping-pong between two otherwise idle ranks is the wrong price for a round of a collective on a
node whose ranks share its cores: each round waits for every rank in it to be scheduled, and the
bytes are copied by the same CPUs (:func:`~tether.comm.collectives.schedule.shared_core_cost`).
The ping-pong's ``a`` misses that wait, and the single-port model charges a tree's one-way
messages at both ends' bandwidth as if each rank had a wire of its own. So where the node's CPUs
move the bytes, the calibration predicts with the three numbers (a round of exchanges' start-up,
a round of one-way messages' start-up, ``b``; ``g`` is the measured add) that make the
shared-core cost of every timed schedule (ring, halving-doubling, recursive doubling, binomial,
naive) closest to its measured times in relative terms. The five differ in how many ranks take
part in a round, whether a rank both sends and receives in it, how many rounds they take and
how many bytes each moves, so three numbers for all of them test the cost model's form rather
than tabulate their times. Two start-ups, because a round in which every rank both sends and
receives waits on both directions of every rank, one in which each only sends or only receives
does not: fitted apart, they differ several times over on shared cores
(benchmarks/results/perf_model_collectives_amd-epyc-2cores.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tether.comm.collectives.registry import COLLECTIVES
from tether.comm.collectives.schedule import Schedule, shared_core_cost

FITTED = ("ring", "halving-doubling", "recursive-doubling", "binomial", "naive")
# b is searched over this range (s/byte: 10 TB/s to 1 MB/s), on a log scale
B_RANGE = (1e-13, 1e-6)
GRID = 28  # 4 points a decade
GOLDEN_STEPS = 30


def _points(
    measured: Mapping[str, Sequence[tuple[float, float]]], world: int
) -> list[tuple[Schedule, float, float]]:
    """(schedule, bytes, seconds) of every fitted algorithm's timed all-reduce from one element
    per rank up (below that the chunked algorithms move less than their schedule says)."""
    points = []
    for name in FITTED:
        for n_bytes, seconds in measured.get(name, ()):
            if n_bytes >= 4 * world and seconds > 0:
                schedule = COLLECTIVES.get(name).schedule(world, int(n_bytes) // 4, "all_reduce")
                points.append((schedule, n_bytes, seconds))
    return points


@dataclass(frozen=True)
class RoundCost:
    """The start-up of a round of exchanges (``alpha``: every rank sends and receives), of a round
    of one-way messages (``one_way_alpha``) and the seconds per byte (``beta``) that price the
    group's schedules (:func:`~tether.comm.collectives.schedule.shared_core_cost`)."""

    alpha: float
    one_way_alpha: float
    beta: float


def _least_squares(
    columns: list[list[float]], targets: list[float], weights: list[float]
) -> tuple[list[float], float]:
    """Non-negative weighted least squares with one or two columns (the exact answer: the
    unconstrained solution if it is non-negative, else the best with a column at 0)."""

    def solve(use: list[int]) -> list[float]:
        x = [0.0] * len(columns)
        if len(use) == 1:
            (i,) = use
            den = sum((w * c) ** 2 for w, c in zip(weights, columns[i], strict=True))
            num = sum(w * w * c * t for w, c, t in zip(weights, columns[i], targets, strict=True))
            x[i] = max(0.0, num / den) if den > 0 else 0.0
            return x
        i, j = use
        sii = sum((w * c) ** 2 for w, c in zip(weights, columns[i], strict=True))
        sjj = sum((w * c) ** 2 for w, c in zip(weights, columns[j], strict=True))
        sij = sum(w * w * u * v for w, u, v in zip(weights, columns[i], columns[j], strict=True))
        ti = sum(w * w * c * t for w, c, t in zip(weights, columns[i], targets, strict=True))
        tj = sum(w * w * c * t for w, c, t in zip(weights, columns[j], targets, strict=True))
        det = sii * sjj - sij * sij
        if det <= 0:
            return [math.nan] * len(columns)
        x[i], x[j] = (ti * sjj - tj * sij) / det, (tj * sii - ti * sij) / det
        return x

    def error(x: list[float]) -> float:
        return sum(
            (w * (sum(xi * col[k] for xi, col in zip(x, columns, strict=True)) - t)) ** 2
            for k, (w, t) in enumerate(zip(weights, targets, strict=True))
        )

    tries = [solve(list(range(len(columns))))] + [solve([i]) for i in range(len(columns))]
    feasible = [x for x in tries if all(v >= 0 for v in x)]  # NaN fails the test too
    best = min(feasible, key=error)
    return best, error(best)


def _start_up_columns(
    points: list[tuple[Schedule, float, float]], cores: int
) -> tuple[list[float], list[float]]:
    """Each time's coefficients of the two start-ups (their stretched round counts)."""
    exchanges = [shared_core_cost(s, n, 1.0, 0.0, 0.0, cores, 0.0) for s, n, _ in points]
    one_way = [shared_core_cost(s, n, 0.0, 0.0, 0.0, cores, 1.0) for s, n, _ in points]
    return exchanges, one_way


def _best_alphas(
    points: list[tuple[Schedule, float, float]],
    columns: tuple[list[float], list[float]],
    beta: float,
    gamma: float,
    cores: int,
) -> tuple[RoundCost, float]:
    """For a given ``beta``: the two start-ups of least squared relative error (the times are
    linear in them, with ``columns`` as coefficients) and that error."""
    exchanges, one_way = columns
    bytes_ = [shared_core_cost(s, n, 0.0, beta, gamma, cores, 0.0) for s, n, _ in points]
    targets = [t - w for (_, _, t), w in zip(points, bytes_, strict=True)]
    weights = [1 / t for _, _, t in points]
    (alpha, alpha1), error = _least_squares([exchanges, one_way], targets, weights)
    return RoundCost(alpha, alpha1, beta), error


def fit_round_cost(
    measured: Mapping[str, Sequence[tuple[float, float]]],
    world: int,
    gamma: float,
    cores: int,
) -> RoundCost | None:
    """The shared-core model's round cost fitted to the timed all-reduce algorithms of a group of
    ``world`` ranks on ``cores`` CPUs; None where fewer than four times were measured."""
    points = _points(measured, world)
    if len(points) < 4:
        return None

    columns = _start_up_columns(points, cores)

    def error(log_b: float) -> float:
        return _best_alphas(points, columns, math.exp(log_b), gamma, cores)[1]

    # a coarse grid over log(b) brackets the best b (the error is piecewise smooth in it, so a
    # search from the whole range could settle in a side valley), a golden-section search
    # narrows it; the start-ups are in closed form for each b
    grid = [
        math.log(B_RANGE[0]) + i * (math.log(B_RANGE[1]) - math.log(B_RANGE[0])) / GRID
        for i in range(GRID + 1)
    ]
    best = min(range(len(grid)), key=lambda i: error(grid[i]))
    lo, hi = grid[max(0, best - 1)], grid[min(GRID, best + 1)]
    ratio = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    f1, f2 = error(x1), error(x2)
    for _ in range(GOLDEN_STEPS):
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - ratio * (hi - lo)
            f1 = error(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + ratio * (hi - lo)
            f2 = error(x2)
    b = math.exp((lo + hi) / 2)
    return _best_alphas(points, columns, b, gamma, cores)[0]
