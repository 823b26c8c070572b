"""Deterministic sharding of the training set across workers.

The property: with global batch B split over W workers, the union of the
workers' batches at each step is the same set of samples whatever W is. So an N-worker synchronous
run sees exactly the samples a one-process run with batch B sees, step for step, which is what
lets the tests compare them and lets benchmarks compare worker counts fairly.

How: every worker draws the same per-epoch permutation from a seeded private generator, cuts it
into global batches of B, and takes its contiguous slice of B/W from each. Nothing depends on W
except which slice a worker takes.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from tether.errors import TetherError

# Large prime multiplier: distinct (seed, epoch) pairs map to distinct generator seeds for any
# realistic epoch count (< 1_000_003), so epoch e of seed s never replays an epoch of seed s+1.
_EPOCH_STRIDE = 1_000_003


def epoch_seed(seed: int, epoch: int) -> int:
    """The torch generator seed for ``epoch``: ``seed * 1_000_003 + epoch`` (mod 2**63)."""
    return (seed * _EPOCH_STRIDE + epoch) % (1 << 63)


class GlobalBatchSampler:
    """Yields the sample indices of each global batch, and each worker's slice of it.

    Epoch ``e`` shuffles with ``torch.randperm(num_samples, generator=Generator().manual_seed(
    epoch_seed(seed, e)))``. The last incomplete global batch of an epoch is dropped, so every
    step has exactly ``global_batch`` samples and no sample appears twice in an epoch. ``step``
    counts globally across epochs: epoch = step // steps_per_epoch.
    """

    def __init__(self, num_samples: int, global_batch: int, seed: int) -> None:
        if global_batch < 1:
            raise TetherError(f"global batch size must be at least 1, got {global_batch}")
        if global_batch > num_samples:
            raise TetherError(
                f"global batch size {global_batch} is larger than the training set "
                f"({num_samples} samples); use a smaller batch size"
            )
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.seed = seed
        self.steps_per_epoch = num_samples // global_batch
        # One epoch's permutation is cached: every step of an epoch reuses it, and regenerating a
        # 60000-element permutation per step would cost more than a small model's forward pass.
        self._cached_epoch = -1
        self._cached_perm = torch.empty(0, dtype=torch.int64)

    def permutation(self, epoch: int) -> torch.Tensor:
        """The full shuffled order of ``epoch`` (int64, length ``num_samples``)."""
        assert epoch >= 0, epoch
        if epoch != self._cached_epoch:
            g = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
            self._cached_perm = torch.randperm(self.num_samples, generator=g)
            self._cached_epoch = epoch
        return self._cached_perm

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def global_indices(self, step: int) -> torch.Tensor:
        """Indices of the ``global_batch`` samples of global step ``step``."""
        assert step >= 0, step
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.global_batch
        return self.permutation(epoch)[start : start + self.global_batch]

    def local_batch(self, world_size: int) -> int:
        """B / W, or a TetherError when the global batch does not split evenly."""
        if world_size < 1 or self.global_batch % world_size != 0:
            raise TetherError(
                f"global batch size {self.global_batch} is not divisible by {world_size} workers; "
                f"pick a batch size that is a multiple of the worker count"
            )
        return self.global_batch // world_size

    def worker_indices(self, step: int, rank: int, world_size: int) -> torch.Tensor:
        """The ``rank``-th contiguous slice (length B/W) of the global batch of ``step``."""
        local = self.local_batch(world_size)
        assert 0 <= rank < world_size, (rank, world_size)
        return self.global_indices(step)[rank * local : (rank + 1) * local]


def shard_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, end)`` of worker ``rank``'s contiguous piece of ``n`` items.

    Pieces differ in length by at most one and together cover every item exactly once; used to
    split the test set for sharded evaluation (the sums are then all-reduced).
    """
    assert world_size >= 1 and 0 <= rank < world_size and n >= 0, (n, rank, world_size)
    base, extra = divmod(n, world_size)
    # The first `extra` ranks take one more item each.
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class WorkerSampler(Sampler[int]):
    """A ``torch.utils.data`` sampler of one worker's samples, epoch by epoch, for a user's own
    loop (``ctx.sampler(dataset)``): with ``DataLoader(dataset, batch_size=b, sampler=...)``
    every batch is this worker's slice of one global batch of ``b * workers`` samples, exactly the
    ones Tether's own trainer would give it. ``set_epoch(e)`` as for ``DistributedSampler``."""

    def __init__(
        self, num_samples: int, batch_size: int, worker: int, workers: int, seed: int = 0
    ) -> None:
        self.global_sampler = GlobalBatchSampler(num_samples, batch_size * workers, seed)
        self.global_sampler.local_batch(workers)  # the split is checked here
        self.worker, self.workers = worker, workers
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        spe = self.global_sampler.steps_per_epoch
        for step in range(self.epoch * spe, (self.epoch + 1) * spe):
            yield from self.global_sampler.worker_indices(step, self.worker, self.workers).tolist()

    def __len__(self) -> int:
        return self.global_sampler.steps_per_epoch * (
            self.global_sampler.global_batch // self.workers
        )
