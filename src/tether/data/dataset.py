"""The in-memory data set every reader returns, and the normalization they share.

All of Tether's data sets are small enough to live in memory as tensors, so a data set is just
four tensors and a class count. Workers index into them with :mod:`tether.data.sharding`; there is
no DataLoader, no worker processes and no per-sample Python, which keeps the input pipeline out
of the timings that the performance model is compared against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A classification data set held in memory.

    Images are float32 of shape ``(N, C, H, W)``, already normalized per channel (mean 0, std 1
    on the train split); labels are int64 of shape ``(N,)`` with values in ``0..num_classes-1``.
    ``eq=False`` because comparing tensors element-wise with ``==`` is not a boolean.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        # Readers are ours, so a violation here is a bug in a reader, not a user error.
        for x, y in ((self.train_x, self.train_y), (self.test_x, self.test_y)):
            assert x.dtype == torch.float32, x.dtype
            assert y.dtype == torch.int64, y.dtype
            assert x.ndim == 4, x.shape
            assert y.ndim == 1, y.shape
            assert x.shape[0] == y.shape[0], (x.shape, y.shape)
        assert self.train_x.shape[1:] == self.test_x.shape[1:], (
            self.train_x.shape,
            self.test_x.shape,
        )
        assert self.num_classes >= 2, self.num_classes

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image, what a model builder needs to size its first layer."""
        c, h, w = self.train_x.shape[1:]
        return (int(c), int(h), int(w))

    @property
    def num_train(self) -> int:
        return int(self.train_x.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_x.shape[0])

    def __repr__(self) -> str:
        # The default repr would print every pixel.
        return (
            f"ArrayDataset(name={self.name!r}, train={self.num_train}, test={self.num_test}, "
            f"sample_shape={self.sample_shape}, num_classes={self.num_classes})"
        )


def channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std (float64, shape ``(C,)``) of an ``(N, C, H, W)`` array."""
    if x.dtype == np.uint8:
        # Count each of the 256 pixel values: exact, and about 5x faster than a floating-point
        # reduction over Fashion-MNIST's 47M pixels, which would dominate the load time.
        values = np.arange(256, dtype=np.float64)
        means, stds = [], []
        for c in range(x.shape[1]):
            plane = torch.from_numpy(np.ascontiguousarray(x[:, c])).view(-1)
            hist = torch.bincount(plane, minlength=256).numpy().astype(np.float64)
            mean = float(hist @ values) / hist.sum()
            means.append(mean)
            stds.append(np.sqrt(float(hist @ (values - mean) ** 2) / hist.sum()))
        return np.array(means), np.array(stds)
    # float64 accumulation: a float32 sum over millions of pixels loses digits.
    return x.mean(axis=(0, 2, 3), dtype=np.float64), x.std(axis=(0, 2, 3), dtype=np.float64)


def standardize(train: np.ndarray, test: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Convert ``(N, C, H, W)`` arrays to float32 tensors normalized per channel.

    Mean and std come from the train split only, so no test information leaks into training, and
    every worker computes the same constants from the same files.
    """
    assert train.ndim == 4 and test.ndim == 4, (train.shape, test.shape)
    mean, std = channel_stats(train)
    std[std == 0] = 1.0  # a constant channel carries no signal; avoid dividing by zero
    shift = torch.from_numpy(mean.astype(np.float32)).view(1, -1, 1, 1)
    scale = torch.from_numpy((1.0 / std).astype(np.float32)).view(1, -1, 1, 1)
    out = []
    for a in (train, test):
        # copy=True: the caller's array must not be normalized in place when it is float32
        # already; for integer pixels the conversion is the copy anyway.
        t = torch.as_tensor(np.ascontiguousarray(a)).to(torch.float32, copy=True)
        t.sub_(shift).mul_(scale)
        out.append(t.contiguous())
    return out[0], out[1]
