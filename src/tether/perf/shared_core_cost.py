"""The time of one all-reduce on one node whose CPUs move the bytes, in closed form.

On a node without a wire between its ranks (gloo over loopback TCP, shared memory) a message
costs CPU at both ends, the kernel copying it out of the sender and into the receiver, and the
ranks share the node's cores. The single-port model (:mod:`tether.perf.collective_cost`) prices
a message ``a + m*b`` on a link of its own and runs every rank at once; here:

* each end of a message of ``m`` bytes costs its rank ``m*b/2`` of CPU, a reduction ``m*g``; a
  round in which every rank sends and receives ``m`` costs ``a + m*b`` as in the single-port
  model, so a ``b`` fitted to ring times keeps its meaning;
* a round takes its busiest rank's work or, with more active ranks than ``cores``, their total
  work over the cores, and its start-up stretches by the same ``active/cores``: ``a`` for a
  round of exchanges (every rank sends and receives: the ring's, recursive doubling's), ``a1``
  where given for a round of one-way messages (a tree's, a fold's), else ``a`` too.

So a tree (binomial, naive), whose ranks only send or only receive in a round, pays half the
single-port price per byte, and with P ranks on C < P cores every algorithm moving the same
total bytes costs about the same: what ``tether bench comm`` measures on such a node. These are
:func:`tether.comm.collectives.schedule.shared_core_cost` of the schedules summed in closed form
(tests/unit/test_perf_formulas.py checks them round by round up to 16 ranks).

It prices collectives on idle ranks (``tether bench comm``'s, the calibration's): a training
step's exchanges are priced with the links and the exchange under load that ``tether calibrate``
measured in training on the same shared cores (:mod:`tether.perf.exchange_load`), which already
holds what sharing the cores costs a message there; stretching it again counts that twice
(the replayed iteration cells: benchmarks/results/perf_model_collectives_amd-epyc-2cores.md).
"""

from __future__ import annotations

import math


def _round(a: float, cores: int, active: int, busiest: float, total: float) -> float:
    """One round: ``active`` ranks, the busiest one's work, all of theirs together."""
    return a * max(1.0, active / cores) + max(busiest, total / cores)


def _symmetric(a: float, cores: int, active: int, work: float) -> float:
    """A round in which ``active`` ranks each do ``work``."""
    return _round(a, cores, active, work, active * work)


def _pairs(a1: float, b: float, g: float, n: float, cores: int, pairs: int, reduce: bool) -> float:
    """A round of ``pairs`` disjoint one-way messages of ``n`` bytes, each rank either sending
    or receiving (and reducing, for a reduction)."""
    red = n * g if reduce else 0.0
    return _round(a1, cores, 2 * pairs, n * b / 2 + red, pairs * (n * b + red))


def _fold(a1: float, b: float, g: float, n: float, world: int, cores: int) -> float:
    """The extra ranks of a non-power-of-two group: one reduce in, one copy out."""
    extra = world - (1 << (world.bit_length() - 1))
    if extra == 0:
        return 0.0
    return _pairs(a1, b, g, n, cores, extra, True) + _pairs(a1, b, g, n, cores, extra, False)


def _binomial_pairs(world: int, mask: int) -> int:
    """Messages in the binomial round whose partners are ``mask`` apart."""
    return len(range(mask, world, 2 * mask))


def shared_core_all_reduce(
    algorithm: str,
    world: int,
    n: float,
    a: float,
    b: float,
    g: float,
    cores: int,
    a1: float | None = None,
) -> float:
    """Seconds of one all-reduce of ``n`` bytes over ``world`` ranks of one node with ``cores``
    CPUs (``native`` and ``hierarchical`` are priced as the ring, as on links)."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, not {cores}")
    a1 = a if a1 is None else a1
    p = world
    p2 = 1 << (p.bit_length() - 1)
    levels = p2.bit_length() - 1
    if algorithm in ("ring", "native", "hierarchical"):
        m = n / p
        return (p - 1) * (_symmetric(a, cores, p, m * (b + g)) + _symmetric(a, cores, p, m * b))
    if algorithm == "halving-doubling":
        inner = 0.0
        for k in range(1, levels + 1):
            m = n / (1 << k)
            inner += _symmetric(a, cores, p2, m * (b + g)) + _symmetric(a, cores, p2, m * b)
        return inner + _fold(a1, b, g, n, p, cores)
    if algorithm == "recursive-doubling":
        return levels * _symmetric(a, cores, p2, n * (b + g)) + _fold(a1, b, g, n, p, cores)
    if algorithm == "binomial":
        total = 0.0
        for k in range(math.ceil(math.log2(p))):
            pairs = _binomial_pairs(p, 1 << k)
            reduce = _pairs(a1, b, g, n, cores, pairs, True)
            total += reduce + _pairs(a1, b, g, n, cores, pairs, False)
        return total
    if algorithm == "naive":
        one = _pairs(a1, b, g, n, cores, 1, True) + _pairs(a1, b, g, n, cores, 1, False)
        return (p - 1) * one
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}")
