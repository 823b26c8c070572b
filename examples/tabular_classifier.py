"""Your own model, data, optimizer and schedule through ``tether.fit``.

A small MLP on scikit-learn's bundled breast-cancer data (569 samples, 30 features), trained with
AdamW and a cosine learning-rate schedule by asynchronous EASGD on 2 workers and a server:

    python examples/tabular_classifier.py [--method async-easgd] [--workers 2] [--out DIR]

Everything handed to ``tether.fit`` is defined at the top level of this file, so the worker
processes can import it; the work itself sits under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import TensorDataset

import tether


def breast_cancer() -> tuple[TensorDataset, TensorDataset]:
    """Standardised features; 400 samples to train on, 169 to evaluate."""
    x, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    mean, std = x[:400].mean(0), x[:400].std(0)
    features = torch.tensor((x - mean) / std, dtype=torch.float32)
    labels = torch.tensor(y, dtype=torch.int64)
    return TensorDataset(features[:400], labels[:400]), TensorDataset(features[400:], labels[400:])


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def adamw(params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=1e-4)


def cosine(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="async-easgd")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="runs/example-tabular")
    args = parser.parse_args()

    train, test = breast_cancer()
    result = tether.fit(
        model=Classifier,  # a class (or any zero-argument callable) building the model
        train_data=train,
        eval_data=test,
        loss=nn.CrossEntropyLoss(label_smoothing=0.05),
        optimizer=adamw,
        scheduler=cosine,
        metrics={"accuracy": tether.metrics.accuracy},
        method=args.method,
        workers=args.workers,
        epochs=10,
        batch_size=16,
        tau=2,
        target=("accuracy", 0.95),
        out=args.out,
        overwrite=True,  # the example's own directory: running it again replaces it
    )
    final = result.summary["final_metrics"]
    reached = result.summary["time_to_target_s"]
    when = f"after {reached:.1f} s" if reached is not None else "not reached"
    print(
        f"{args.method}: test accuracy {final['accuracy']:.3f}, loss {final['loss']:.3f}; 95% {when}"
    )
    # result.model is the center variable, loaded in this process
    with torch.no_grad():
        predicted = result.model(test.tensors[0]).argmax(1)
    print(f"recomputed here: {(predicted == test.tensors[1]).float().mean():.3f}")


if __name__ == "__main__":
    main()
