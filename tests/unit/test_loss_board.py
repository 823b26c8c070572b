"""The Hogwild loss board (tether.methods.loss_board): a reader never takes a sum and a count
that do not belong together, while a writer in another process keeps adding."""

from __future__ import annotations

import multiprocessing

import torch

from tether.methods.loss_board import LossBoard

ADDS = 20_000


def _write(words: torch.Tensor) -> None:
    board = LossBoard(words)
    for _ in range(ADDS):
        board.add(1, 2.0, 1)  # every loss is 2.0: a whole pair has sum == 2 * count


def test_a_reader_takes_whole_pairs_only() -> None:
    words = torch.zeros(LossBoard.size(2), dtype=torch.float64).share_memory_()
    board = LossBoard(words)
    writer = multiprocessing.get_context("fork").Process(target=_write, args=(words,))
    writer.start()
    pairs = []
    while writer.is_alive() or not pairs:
        pair = board.read(1)
        if pair is not None:
            pairs.append(pair)
    writer.join()
    assert all(total == 2.0 * count for total, count in pairs), [
        p for p in pairs if p[0] != 2.0 * p[1]
    ][:5]
    assert board.read(1) == (2.0 * ADDS, ADDS) and board.read(0) == (0.0, 0)
    assert len({count for _, count in pairs}) > 10  # it did read while the writer wrote


def test_a_worker_that_never_stops_writing_is_read_next_time() -> None:
    words = torch.zeros(LossBoard.size(1), dtype=torch.float64)
    words[2] = 1.0  # odd: a writer in the middle of a change
    assert LossBoard(words).read(0) is None
