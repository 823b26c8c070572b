"""Batches for the step loop and for evaluation, from any map-style dataset.

Training batches follow :class:`~tether.data.sharding.GlobalBatchSampler`: the samples of global
step ``m`` depend only on the seed and ``m``, and worker ``i`` of ``W`` takes the ``i``-th slice,
so a run resumes bitwise and 1 worker with batch 64 sees what 2 workers with batch 32 see.

A ``torch.utils.data.TensorDataset`` (every built-in data set is one) is indexed directly, one
tensor index per batch: no DataLoader, no per-sample Python, which keeps the input pipeline out
of the timings of small models. Any other dataset goes through a ``DataLoader`` with a batch
sampler giving those same indices, the user's ``collate_fn`` and loader options (``num_workers``,
``pin_memory``, ...). Batches (tensors, or tuples, lists and dicts of them) are moved to the
worker's device.

A DataLoader draws a seed for its worker processes each time it starts iterating, from its
``generator`` or else from torch's global generator: here it has its own (unless the options
give one), so reading data shifts no random number the model draws (dropout), and a resumed run,
whose training loader starts at the checkpoint's step, draws what the uninterrupted run drew.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, TensorDataset

from tether.data.sharding import GlobalBatchSampler, epoch_seed, shard_range


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it on ``device`` (tuples, lists and dicts walked)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple (default_collate
        return type(batch)(*(to_device(value, device) for value in batch))  # keeps them)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(value, device) for value in batch)
    return batch


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, tuple | list):
        for item in batch:
            size = batch_size_of(item)
            if size:
                return size
    return 0


class _WorkerSlices(Sampler[list[int]]):
    """The index lists of one worker's batches for global steps ``start`` to ``stop - 1``."""

    def __init__(
        self, sampler: GlobalBatchSampler, worker: int, workers: int, start: int, stop: int
    ) -> None:
        self.sampler, self.worker, self.workers = sampler, worker, workers
        self.start, self.stop = start, stop

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start, self.stop):
            yield self.sampler.worker_indices(step, self.worker, self.workers).tolist()

    def __len__(self) -> int:
        return max(0, self.stop - self.start)


class TrainBatches:
    """One worker's training batches, global step by global step (a global step here is one
    backward pass of every worker: with gradient accumulation, one optimizer step takes
    several)."""

    def __init__(
        self,
        dataset: Dataset,
        sampler: GlobalBatchSampler,
        worker: int,
        workers: int,
        device: torch.device,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        loader_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.dataset, self.sampler = dataset, sampler
        self.worker, self.workers, self.device = worker, workers, device
        self.collate_fn = collate_fn
        self.loader_options = dict(loader_options or {})

    def iterate(self, start: int, stop: int) -> Iterator[Any]:
        """The batches of global steps ``start .. stop - 1``, on the device."""
        if isinstance(self.dataset, TensorDataset) and self.collate_fn is None:
            tensors = self.dataset.tensors
            for step in range(start, stop):
                idx = self.sampler.worker_indices(step, self.worker, self.workers)
                yield to_device(tuple(t[idx] for t in tensors), self.device)
            return
        slices = _WorkerSlices(self.sampler, self.worker, self.workers, start, stop)
        # seeded by the run's seed and the first step: a resumed run's worker processes do not
        # replay the first steps' random numbers
        own = torch.Generator().manual_seed(epoch_seed(self.sampler.seed, start))
        options = {"generator": own, **self.loader_options}
        loader = DataLoader(
            self.dataset, batch_sampler=slices, collate_fn=self.collate_fn, **options
        )
        for batch in loader:
            yield to_device(batch, self.device)


def eval_batches(
    dataset: Dataset,
    rank: int,
    world: int,
    batch_size: int,
    device: torch.device,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    loader_options: Mapping[str, Any] | None = None,
) -> Iterator[Any]:
    """Rank ``rank``'s contiguous share of ``dataset`` (of ``world`` shares), in batches."""
    n = len(dataset)  # type: ignore[arg-type]
    lo, hi = shard_range(n, rank, world)
    if isinstance(dataset, TensorDataset) and collate_fn is None:
        for start in range(lo, hi, batch_size):
            end = min(start + batch_size, hi)
            yield to_device(tuple(t[start:end] for t in dataset.tensors), device)
        return
    loader = DataLoader(
        Subset(dataset, range(lo, hi)),
        batch_size=batch_size,
        collate_fn=collate_fn,
        **{"generator": torch.Generator(), **(loader_options or {})},
    )
    for batch in loader:
        yield to_device(batch, device)
