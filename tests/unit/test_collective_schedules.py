"""Collective schedules as data, without processes: shapes, what they compute, and their cost
against the closed forms of docs/communication.md."""

from __future__ import annotations

import math

import pytest
import torch

from tether.comm.chunks import chunk_bounds
from tether.comm.collectives import COLLECTIVES, Schedule, Step, collectives_for, cost, simulate
from tether.comm.collectives.base import check_op
from tether.comm.collectives.binomial import (
    binomial_all_gather,
    binomial_broadcast,
    binomial_reduce,
)
from tether.comm.collectives.chain import chain_broadcast, chain_time, choose_chunks
from tether.comm.collectives.halving_doubling import halving_doubling_all_reduce
from tether.comm.collectives.naive import naive_all_gather, naive_all_reduce
from tether.comm.collectives.recursive_doubling import (
    recursive_doubling_all_gather,
    recursive_doubling_all_reduce,
)
from tether.comm.collectives.ring import ring_all_gather, ring_all_reduce
from tether.errors import TetherError

WORLDS = range(1, 10)
ALL_REDUCE = [name for name in collectives_for("all_reduce") if name not in ("native", "auto")]


def _inputs(world: int, n: int) -> list[torch.Tensor]:
    # small integers in float64: every summation order gives the exact sum
    return [torch.arange(n, dtype=torch.float64) * (r + 1) + r for r in range(world)]


@pytest.mark.parametrize("name", ALL_REDUCE)
@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_schedules_compute_the_sum_and_max_everywhere(name: str, world: int) -> None:
    for n in sorted({1, max(world - 1, 1), 7, 13, 64}):
        schedule = COLLECTIVES.get(name).schedule(world, n)
        inputs = _inputs(world, n)
        total = torch.stack(inputs).sum(0)
        assert all(torch.equal(t, total) for t in simulate(schedule, inputs)), (name, world, n)
        maxima = simulate(schedule, inputs, torch.maximum)
        assert all(torch.equal(t, torch.stack(inputs).amax(0)) for t in maxima)


@pytest.mark.parametrize(
    "name", [n for n in collectives_for("broadcast") if n not in ("native", "auto")]
)
@pytest.mark.parametrize("world", WORLDS)
def test_broadcast_schedules_copy_the_root_everywhere(name: str, world: int) -> None:
    for root in {0, world - 1, world // 2}:
        for n in (1, 7, 1000):
            inputs = _inputs(world, n)
            out = simulate(COLLECTIVES.get(name).schedule(world, n, "broadcast", root), inputs)
            assert all(torch.equal(t, inputs[root]) for t in out), (name, world, root, n)


@pytest.mark.parametrize("name", ["naive", "binomial"])
@pytest.mark.parametrize("world", WORLDS)
def test_reduce_schedules_sum_at_the_root(name: str, world: int) -> None:
    for root in {0, world - 1, world // 2}:
        inputs = _inputs(world, 7)
        out = simulate(COLLECTIVES.get(name).schedule(world, 7, "reduce", root), inputs)
        assert torch.equal(out[root], torch.stack(inputs).sum(0))


@pytest.mark.parametrize(
    "name", [n for n in collectives_for("all_gather") if n not in ("native", "auto")]
)
@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_schedules_give_every_rank_every_chunk(name: str, world: int) -> None:
    for n in sorted({1, max(world - 1, 1), 7, 13, 64}):
        bounds = chunk_bounds(n, world)
        inputs = [torch.full((n,), -1.0) for _ in range(world)]
        for r, (lo, hi) in enumerate(bounds):
            inputs[r][lo:hi] = torch.arange(lo, hi, dtype=torch.float64)
        out = simulate(COLLECTIVES.get(name).schedule(world, n, "all_gather"), inputs)
        want = torch.arange(n, dtype=torch.float64)
        assert all(torch.equal(t, want) for t in out), (name, world, n)


@pytest.mark.parametrize("world", range(2, 10))
def test_all_gather_shapes_and_costs(world: int) -> None:
    ring = ring_all_gather(world)
    assert ring.num_rounds == world - 1
    assert ring.links() == {(i, (i + 1) % world) for i in range(world)}
    # each rank sends every chunk but the one it receives last: (P-1)/P of the vector
    n = world * 250
    assert ring.elements_sent(n) == [n - 250] * world
    assert cost(ring, 1000.0, 1.0, 0.01, 5.0) == pytest.approx(
        (world - 1) * (1 + 1000 / world * 0.01)
    )
    levels = (world - 1).bit_length()  # ceil(log2 P)
    assert binomial_all_gather(world).num_rounds == 2 * levels
    assert naive_all_gather(world).num_rounds == 2 * (world - 1)
    doubling = recursive_doubling_all_gather(world)
    fold = 0 if world & (world - 1) == 0 else 2  # one round in, one out
    assert doubling.num_rounds == world.bit_length() - 1 + fold
    if fold == 0:  # log2(P) rounds moving (P-1)/P of the vector, like the ring
        assert doubling.elements_sent(n) == [n - 250] * world
        assert cost(doubling, 1000.0, 1.0, 0.01, 5.0) == pytest.approx(
            math.log2(world) + (world - 1) / world * 1000 * 0.01
        )


@pytest.mark.parametrize("world", range(2, 10))
def test_ring_shape(world: int) -> None:
    ring = ring_all_reduce(world)
    assert ring.num_rounds == 2 * (world - 1)
    assert ring.links() == {(i, (i + 1) % world) for i in range(world)}
    for n in (world * 250, 7, 1001):
        ideal = 2 * (world - 1) / world * n
        # each of the 2(P-1) chunks sent is within one element of n/P
        assert all(abs(sent - ideal) < 2 * (world - 1) for sent in ring.elements_sent(n))
        if n % world == 0:
            assert ring.bytes_sent(n, 4) == [round(ideal) * 4] * world


def test_halving_doubling_and_recursive_doubling_rounds() -> None:
    for world in (2, 4, 8, 16):
        log = int(math.log2(world))
        assert halving_doubling_all_reduce(world).num_rounds == 2 * log
        assert recursive_doubling_all_reduce(world).num_rounds == log
        n = world * 100
        assert (
            halving_doubling_all_reduce(world).elements_sent(n)
            == [2 * (world - 1) * n // world] * world
        )
    for world in (3, 5, 6, 7, 12):  # the fold adds one round before and one after
        log = int(math.log2(world))
        assert halving_doubling_all_reduce(world).num_rounds == 2 * log + 2
        assert recursive_doubling_all_reduce(world).num_rounds == log + 2


def test_binomial_and_chain_rounds() -> None:
    for world in range(1, 18):
        levels = math.ceil(math.log2(world)) if world > 1 else 0
        assert binomial_reduce(world, world // 2).num_rounds == levels
        assert binomial_broadcast(world, world - 1).num_rounds == levels
        assert COLLECTIVES.get("binomial").schedule(world, 5).num_rounds == 2 * levels
    for world in range(2, 7):
        for chunks in range(1, 6):
            assert chain_broadcast(world, 1 % world, chunks).num_rounds == world - 2 + chunks


A, B, G = 3e-5, 1e-9, 2e-10


@pytest.mark.parametrize("n", [4.0, 1e6, 3e8])
@pytest.mark.parametrize("world", range(2, 10))
def test_costs_match_the_closed_forms(world: int, n: float) -> None:
    p, log, clog = world, math.log2(world), math.ceil(math.log2(world))
    frac = (p - 1) / p
    ring = 2 * (p - 1) * A + 2 * frac * n * B + frac * n * G
    assert cost(ring_all_reduce(p), n, A, B, G) == pytest.approx(ring, rel=1e-12)
    p2 = 1 << (p.bit_length() - 1)
    inner = 2 * math.log2(p2) * A + 2 * (p2 - 1) / p2 * n * B + (p2 - 1) / p2 * n * G
    fold = 0.0 if p == p2 else (A + n * B + n * G) + (A + n * B)
    hd = cost(halving_doubling_all_reduce(p), n, A, B, G)
    assert hd == pytest.approx(inner + fold, rel=1e-12)
    rd = math.log2(p2) * (A + n * B + n * G) + fold
    assert cost(recursive_doubling_all_reduce(p), n, A, B, G) == pytest.approx(rd, rel=1e-12)
    if p == p2:  # the closed forms (docs/communication.md), stated for powers of two
        assert hd == pytest.approx(2 * log * A + 2 * frac * n * B + frac * n * G, rel=1e-12)
        assert rd == pytest.approx(log * (A + n * B + n * G), rel=1e-12)
    reduce = cost(binomial_reduce(p, p - 1), n, A, B, G)
    assert reduce == pytest.approx(clog * (A + n * B + n * G), rel=1e-12)
    bcast = cost(binomial_broadcast(p, 1), n, A, B, G)
    assert bcast == pytest.approx(clog * (A + n * B), rel=1e-12)
    for chunks in (1, 2, 7):
        chain = cost(chain_broadcast(p, 0, chunks), n, A, B, G)
        assert chain == pytest.approx((p - 2 + chunks) * (A + n / chunks * B), rel=1e-12)
        assert chain == pytest.approx(chain_time(p, chunks, n, A, B), rel=1e-12)
    naive = (p - 1) * (A + n * B + n * G) + (p - 1) * (A + n * B)
    assert cost(naive_all_reduce(p), n, A, B, G) == pytest.approx(naive, rel=1e-12)


def test_chain_chunk_choice_is_the_model_optimum() -> None:
    for world in (2, 3, 4, 8):
        for n in (4.0, 4e3, 4e5, 4e7):
            chosen = choose_chunks(world, n, A, B, max_chunks=4096)
            brute = min(range(1, 4097), key=lambda c: (chain_time(world, c, n, A, B), c))
            assert chain_time(world, chosen, n, A, B) == pytest.approx(
                chain_time(world, brute, n, A, B), rel=1e-12
            )
    n = 1e9  # large messages: the pipelined chain approaches n*b, well under a binomial tree
    best = chain_time(8, choose_chunks(8, n, A, B, 10**6), n, A, B)
    assert best < 1.05 * n * B < cost(binomial_broadcast(8, 0), n, A, B, G) / 2.5
    assert choose_chunks(4, 4e5, A, B, max_chunks=3) <= 3


def test_registry_and_errors() -> None:
    assert COLLECTIVES.names() == [
        "naive",
        "ring",
        "halving-doubling",
        "recursive-doubling",
        "binomial",
        "chain",
        "hierarchical",
        "native",
        "auto",
    ]
    assert collectives_for("broadcast") == [
        "naive",
        "binomial",
        "chain",
        "hierarchical",
        "native",
        "auto",
    ]
    with pytest.raises(TetherError, match="valid collectives: naive, ring"):
        COLLECTIVES.get("rnig")
    with pytest.raises(TetherError, match="'ring' does not implement broadcast"):
        COLLECTIVES.get("ring").schedule(4, 10, "broadcast")
    with pytest.raises(TetherError, match="no schedule"):
        COLLECTIVES.get("native").schedule(4, 10)
    with pytest.raises(TetherError, match="needs a floating-point tensor"):
        check_op("avg", torch.int64)
    with pytest.raises(TetherError, match="unknown reduce op 'prod'"):
        check_op("prod", torch.float32)


def test_schedules_refuse_bad_steps() -> None:
    with pytest.raises(AssertionError, match="sends twice"):
        Schedule("bad", 3, (Step(0, 0, 1, 0, "copy"), Step(0, 0, 2, 0, "copy")))
    with pytest.raises(AssertionError):  # copy into a chunk being sent in the same round
        Schedule("bad", 2, (Step(0, 0, 1, 0, "copy"), Step(0, 1, 0, 0, "copy")))
    with pytest.raises(AssertionError):  # chunks of one message must be consecutive
        Schedule("bad", 2, (Step(0, 0, 1, (0, 2), "copy"),), chunks=3)
