"""GlobalBatchSampler and shard_range: the worker-count-independence property."""

from __future__ import annotations

import pytest
import torch

from tether.data import GlobalBatchSampler, shard_range
from tether.errors import TetherError


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_union_of_worker_batches_is_the_global_batch(world_size: int) -> None:
    # 100 samples, B=12: 8 steps per epoch, so steps 7..9 cross an epoch boundary.
    reference = GlobalBatchSampler(100, 12, seed=5)
    samplers = [GlobalBatchSampler(100, 12, seed=5) for _ in range(world_size)]
    for step in (0, 1, 7, 8, 9, 23, 100):
        parts = [s.worker_indices(step, r, world_size) for r, s in enumerate(samplers)]
        assert all(len(p) == 12 // world_size for p in parts)
        union = torch.cat(parts)
        # Same samples in the same order: rank r's slice is the r-th piece of the global batch.
        assert torch.equal(union, reference.global_indices(step))
        assert len(set(union.tolist())) == 12


def test_epochs_differ_and_samples_at_most_once_per_epoch() -> None:
    s = GlobalBatchSampler(100, 12, seed=0)
    assert s.steps_per_epoch == 8
    for epoch in range(3):
        seen = torch.cat([s.global_indices(epoch * 8 + i) for i in range(8)])
        assert len(seen) == 96 and len(set(seen.tolist())) == 96  # last 4 samples dropped
        assert int(seen.min()) >= 0 and int(seen.max()) < 100
    assert not torch.equal(s.permutation(0), s.permutation(1))
    assert s.epoch_of(7) == 0 and s.epoch_of(8) == 1


def test_determinism_and_seed_dependence() -> None:
    a, b = GlobalBatchSampler(50, 10, seed=3), GlobalBatchSampler(50, 10, seed=3)
    steps = [7, 0, 12, 3]  # out of order: the epoch cache must not change the answer
    assert all(torch.equal(a.global_indices(t), b.global_indices(t)) for t in steps)
    c = GlobalBatchSampler(50, 10, seed=4)
    assert not torch.equal(a.permutation(0), c.permutation(0))


def test_errors() -> None:
    s = GlobalBatchSampler(100, 12, seed=0)
    with pytest.raises(TetherError, match="not divisible by 5 workers"):
        s.worker_indices(0, 0, 5)
    with pytest.raises(TetherError, match="larger than the training set"):
        GlobalBatchSampler(10, 11, seed=0)
    with pytest.raises(TetherError, match="at least 1"):
        GlobalBatchSampler(10, 0, seed=0)


@pytest.mark.parametrize("n", [0, 1, 7, 10, 10000])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_shard_range_covers_each_index_once(n: int, world_size: int) -> None:
    ranges = [shard_range(n, r, world_size) for r in range(world_size)]
    covered = [i for start, end in ranges for i in range(start, end)]
    assert covered == list(range(n))  # contiguous, in order, each exactly once
    sizes = [end - start for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1
