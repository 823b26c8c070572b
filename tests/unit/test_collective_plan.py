"""Compiled per-rank plans (tether.comm.collectives.plan) against the schedule simulator.

Every rank's plan is executed in lockstep in one process, matching each sender's messages to each
receiver in posting order as gloo and MPI do, and must give exactly what
:func:`~tether.comm.collectives.schedule.simulate` gives; small piece sizes force the pipelined
pieces. Receives marked ``early`` (posted while the previous round is in flight) must not land on
anything that round still uses."""

from __future__ import annotations

import itertools

import pytest
import torch

from tether.comm.collectives import COLLECTIVES
from tether.comm.collectives.plan import RoundPlan, compile_plan, piece_ranges
from tether.comm.collectives.ring import ring_all_reduce
from tether.comm.collectives.schedule import Schedule, Step, simulate

SCHEDULED = [name for name in COLLECTIVES if name not in ("native", "auto")]


@pytest.mark.parametrize("length", [1, 2, 7, 64, 1000])
@pytest.mark.parametrize("piece_bytes", [4, 12, 64, 1 << 20])
def test_piece_ranges_cut_like_tensor_split(length: int, piece_bytes: int) -> None:
    ranges = piece_ranges(10, 10 + length, 4, piece_bytes)
    count = len(ranges)
    expected = torch.tensor_split(torch.arange(10, 10 + length), count) if count > 1 else None
    assert ranges[0][0] == 10 and ranges[-1][1] == 10 + length
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    whole_pieces = (length * 4) // piece_bytes
    assert count == (whole_pieces if whole_pieces >= 2 else 1)
    if expected is not None:
        assert [(int(t[0]), int(t[-1]) + 1) for t in expected] == ranges


def _run_plans(
    schedule: Schedule, inputs: list[torch.Tensor], piece_bytes: int
) -> list[torch.Tensor]:
    """Execute every rank's compiled plan round by round; sends read start-of-round values."""
    world, n = schedule.world_size, inputs[0].numel()
    state = [t.clone() for t in inputs]
    plans = [compile_plan(schedule, r, n, 4, piece_bytes) for r in range(world)]
    by_round: list[dict[int, RoundPlan]] = [{} for _ in range(schedule.num_rounds)]
    for rank, plan in enumerate(plans):
        numbers = [rp.round for rp in plan]
        assert numbers == sorted(set(numbers)), "one plan round per schedule round, in order"
        for rp in plan:
            by_round[rp.round][rank] = rp
        for previous, rp in itertools.pairwise(plan):
            if rp.early:
                for c in rp.copies:
                    busy = [*previous.copies, *previous.reductions]
                    busy += [t for t in previous.sends if t.peer != c.peer]
                    assert all(c.stop <= b.start or b.stop <= c.start for b in busy)
    for rounds in by_round:
        snapshot = [t.clone() for t in state]
        queues: dict[tuple[int, int], list[torch.Tensor]] = {}
        for rank, rp in rounds.items():
            for t in rp.sends:
                queues.setdefault((rank, t.peer), []).append(snapshot[rank][t.start : t.stop])
        for rank, rp in rounds.items():
            scratch = torch.full((rp.scratch_numel,), float("nan"))
            for red in rp.reductions:  # reduced pieces are received first, in order
                piece = queues[(red.peer, rank)].pop(0)
                assert piece.numel() == red.stop - red.start
                scratch[red.offset : red.offset + piece.numel()] = piece
            for t in rp.copies:
                state[rank][t.start : t.stop] = queues[(t.peer, rank)].pop(0)
            for red in rp.reductions:
                state[rank][red.start : red.stop] += scratch[
                    red.offset : red.offset + red.stop - red.start
                ]
            assert not scratch.isnan().any(), "every scratch element is received"
        assert all(not q for q in queues.values()), "every message is received"
    return state


@pytest.mark.parametrize("name", SCHEDULED)
@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_plans_do_what_the_schedule_says(name: str, world: int) -> None:
    collective = COLLECTIVES.get(name)
    for kind in collective.kinds:
        for n in (1, world - 1 or 1, 13, 100):
            for piece_bytes in (8, 1 << 20):
                schedule = collective.schedule(world, n, kind, root=world - 1)
                inputs = [torch.arange(n, dtype=torch.float64) * (r + 2) + r for r in range(world)]
                got = _run_plans(schedule, inputs, piece_bytes)
                want = simulate(schedule, inputs)
                for rank in range(world):
                    assert torch.equal(got[rank], want[rank]), (name, kind, world, n, rank)


def test_early_receives_wait_where_the_previous_round_still_sends_there() -> None:
    # 2 ranks: the all-gather round receives into the chunk the reduce-scatter round sends, but
    # from the rank it was sent to, which sends again only after receiving all of it.
    two = compile_plan(ring_all_reduce(2), 0, 100, 4, 1 << 20)
    assert [rp.early for rp in two] == [False, True]
    # Rank 0 sends chunk 0 to rank 1, then receives chunk 0 from rank 2, which need not wait
    # for rank 1: that receive must wait for the send.
    to_other = Schedule("t", 3, (Step(0, 0, 1, 0, "copy"), Step(1, 2, 0, 0, "copy")), chunks=2)
    assert [rp.early for rp in compile_plan(to_other, 0, 100, 4, 1 << 20)] == [False, False]
    # Two receives into one chunk from two ranks: the second waits for the first.
    twice = Schedule("t", 3, (Step(0, 1, 0, 0, "copy"), Step(1, 2, 0, 0, "copy")), chunks=2)
    assert [rp.early for rp in compile_plan(twice, 0, 100, 4, 1 << 20)] == [False, False]
    # Receiving the other chunk is early.
    apart = Schedule("t", 3, (Step(0, 0, 1, 0, "copy"), Step(1, 2, 0, 1, "copy")), chunks=2)
    assert [rp.early for rp in compile_plan(apart, 0, 100, 4, 1 << 20)] == [False, True]
    # 4 ranks: every round after the first lands on chunks the round before does not touch.
    four = compile_plan(ring_all_reduce(4), 0, 100, 4, 1 << 20)
    assert [rp.early for rp in four] == [False] + [True] * 5


def test_plans_are_cached_per_rank_size_and_piece_size() -> None:
    schedule = ring_all_reduce(3)
    first = compile_plan(schedule, 1, 50, 4, 1 << 20)
    assert compile_plan(schedule, 1, 50, 4, 1 << 20) is first
    assert compile_plan(schedule, 1, 50, 4, 8) is not first
    assert compile_plan(schedule, 2, 50, 4, 1 << 20) is not first
