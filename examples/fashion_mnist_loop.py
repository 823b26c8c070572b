"""Your own training loop, switched from PyTorch DDP to sync-easgd by changing three lines.

A small CNN on Fashion-MNIST (Debian's dataset-fashion-mnist files, or --data-dir), run by any
launcher:

    torchrun --nproc-per-node 2 examples/fashion_mnist_loop.py [--steps 300]
    tether launch --workers 2 examples/fashion_mnist_loop.py

The same script under DDP would read (the three lines that change are marked)::

    dist.init_process_group("gloo")                                  # 1
    model = DistributedDataParallel(Net()); opt = SGD(...)           # 2
    sampler = DistributedSampler(train)                              # 3

With Tether::

    ctx = tether.init(method="sync-easgd")                           # 1
    model, opt = ctx.wrap(Net(), SGD(...))                           # 2
    sampler = ctx.sampler(train)                                     # 3

and the rest (zero_grad, backward, step) stays as it was. sync-easgd's workers take their own
steps and average elastically every ``tau`` steps with one all-reduce, overlapped with the next
steps; the model to evaluate is the center variable, ``ctx.eval_model()``.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tether

DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or not): big-endian dimensions after a 4-byte magic."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion_mnist(directory: Path, split: str) -> TensorDataset:
    prefix = "train" if split == "train" else "t10k"
    found = {p.name.split(".")[0]: p for p in directory.glob(f"{prefix}-*")}
    images = read_idx(found[f"{prefix}-images-idx3-ubyte"]).astype(np.float32) / 255.0
    labels = read_idx(found[f"{prefix}-labels-idx1-ubyte"]).astype(np.int64)
    x = (torch.from_numpy(images) - 0.286) / 0.353  # the training set's mean and std
    return TensorDataset(x.unsqueeze(1), torch.from_numpy(labels))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 5 * 5, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    ctx = tether.init(method="sync-easgd", tau=2)  # 1: instead of dist.init_process_group
    train = fashion_mnist(args.data_dir, "train")
    test = fashion_mnist(args.data_dir, "test")
    torch.manual_seed(0)
    net = Net()
    model, optimizer = ctx.wrap(net, torch.optim.SGD(net.parameters(), lr=0.05))  # 2: not DDP
    sampler = ctx.sampler(train, args.batch_size)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0 and ctx.is_main:
                print(f"step {step}: loss {loss.item():.3f}", flush=True)
            if step == args.steps:
                break
        epoch += 1

    center = ctx.eval_model()  # every worker calls it (it may communicate)
    ctx.finish()  # before the evaluation: the run is over, its model stays usable
    if ctx.is_main:
        with torch.no_grad():
            x, y = test.tensors
            correct = sum(
                int((center(x[i : i + 1000]).argmax(1) == y[i : i + 1000]).sum())
                for i in range(0, 2000, 1000)
            )
        print(
            f"sync-easgd, {ctx.workers} workers, {step} steps: test accuracy {correct / 2000:.3f}"
        )


if __name__ == "__main__":
    main()
