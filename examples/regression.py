"""A regression with a mean-squared-error loss through ``tether.fit``.

scikit-learn's bundled diabetes data (442 patients, 10 features, a disease-progression score),
a linear-plus-MLP model, MSE, and local SGD on 2 workers:

    python examples/regression.py [--method local-sgd] [--workers 2] [--out DIR]

No accuracy here: the evaluation reports the loss and the metric asked for, the mean absolute
error (in the target's units), and the run is timed against a loss target.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from sklearn.datasets import load_diabetes
from torch import nn
from torch.utils.data import TensorDataset

import tether

SCALE = 100.0  # targets are divided by this for training (their range is 25..346)


def diabetes() -> tuple[TensorDataset, TensorDataset]:
    x, y = load_diabetes(return_X_y=True, scaled=True)
    order = np.random.default_rng(1).permutation(len(y))
    features = torch.tensor(x[order] / x.std(0), dtype=torch.float32)
    targets = torch.tensor(y[order] / SCALE, dtype=torch.float32)
    return TensorDataset(features[:352], targets[:352]), TensorDataset(
        features[352:], targets[352:]
    )


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))


def mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs.squeeze(1), targets)


def mae(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean absolute error in the target's own units."""
    return float((outputs.squeeze(1) - targets).abs().mean()) * SCALE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="local-sgd")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="runs/example-regression")
    args = parser.parse_args()

    train, test = diabetes()
    result = tether.fit(
        model=build,
        train_data=train,
        eval_data=test,
        loss=mse,
        metrics={"mae": mae},
        method=args.method,
        workers=args.workers,
        epochs=30,
        batch_size=16,
        lr=0.05,  # the default optimizer: the method's own (momentum SGD for local-sgd)
        target=("loss", 0.35),  # a loss target: reached when the test MSE drops below
        out=args.out,
        overwrite=True,  # the example's own directory: running it again replaces it
    )
    final = result.summary["final_metrics"]
    baseline = float((test.tensors[1] - train.tensors[1].mean()).abs().mean()) * SCALE
    print(
        f"{args.method}: test MSE {final['loss']:.3f}, mean absolute error {final['mae']:.1f} "
        f"(predicting the mean: {baseline:.1f})"
    )


if __name__ == "__main__":
    main()
