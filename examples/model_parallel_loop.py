"""Model parallelism in your own training loop: a data x model grid of 2 x 2 processes.

Each model group of two processes splits the MLP's two wide layers (fc1 by output features,
fc2 by input features: one all-reduce of the activations forward and one backward), and the
two model groups average elastically with sync-easgd, each group acting as one EASGD worker
(the grid composes with sync-sgd and local-sgd too: --method). Run it with four processes:

    tether launch --workers 4 examples/model_parallel_loop.py
    torchrun --nproc-per-node 4 examples/model_parallel_loop.py

Data: scikit-learn's bundled digits (8x8 images, 10 classes).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tether
from tether.parallel import full_state_dict


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 64)
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


def digits() -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits(return_X_y=True)
    features = torch.tensor(x / 16.0, dtype=torch.float32)
    labels = torch.tensor(y, dtype=torch.int64)
    return TensorDataset(features[:1500], labels[:1500]), TensorDataset(
        features[1500:], labels[1500:]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # default: tether launch --method's, else tether.init's own (sync-easgd)
    parser.add_argument("--method", default=None)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    ctx = tether.init(method=args.method, model_parallel=2)
    train, test = digits()
    torch.manual_seed(0)  # every rank builds the same full model, then keeps its slices
    net = ctx.parallelize(Net(), {"fc1": "column", "fc2": "row"})
    sgd = torch.optim.SGD(net.parameters(), lr=0.4)
    model, optimizer = ctx.wrap(net, sgd)

    # Both ranks of a model group read the same batches: the sampler follows the data axis.
    sampler = ctx.sampler(train, 32)
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    center = ctx.eval_model()  # sharded like the replicas
    state = full_state_dict(center)  # every rank calls it: the slices are gathered
    whole = Net()
    whole.load_state_dict(state)  # the unsharded model, on one process
    with torch.no_grad():
        accuracy = (whole(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean()
    if ctx.is_main:
        print(
            f"{ctx.config.method} on a 2 x 2 grid: test accuracy {accuracy:.3f} (unsharded model)"
        )
    ctx.finish()


if __name__ == "__main__":
    main()
