"""A parameter-server method in your own training loop.

Asynchronous SGD (Dean et al.'s Downpour): each worker pushes its gradient and pulls the current
weights; the server applies the gradients with YOUR optimizer as they arrive, first come first
served. Run it with one more process than workers (rank 0 serves):

    tether launch --workers 2 --method async-sgd examples/parameter_server_loop.py
    torchrun --nproc-per-node 3 examples/parameter_server_loop.py

Rank 0 runs this script up to ``ctx.wrap``, serves there until every worker has finished, and
exits; the workers run the loop. Data: scikit-learn's bundled digits (8x8 images, 10 classes).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tether


def digits() -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits(return_X_y=True)
    features = torch.tensor(x / 16.0, dtype=torch.float32)
    labels = torch.tensor(y, dtype=torch.int64)
    return TensorDataset(features[:1500], labels[:1500]), TensorDataset(
        features[1500:], labels[1500:]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="async-sgd")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    ctx = tether.init(method=args.method)
    train, test = digits()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    # The server applies the pushed gradients with this optimizer (and keeps its state).
    sgd = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.5)
    model, optimizer = ctx.wrap(net, sgd)  # rank 0 serves in here, then exits

    sampler = ctx.sampler(train, 32)
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()  # push the gradient, take the server's weights

    served = ctx.eval_model()  # the server's current weights
    ctx.finish()  # the goodbye, before the evaluation (a worker silent for --timeout is given up)
    with torch.no_grad():
        accuracy = (served(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean()
    print(
        f"worker {ctx.worker_index}: the server's weights score {accuracy:.3f} on the test digits"
    )


if __name__ == "__main__":
    main()
