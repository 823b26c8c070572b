"""scikit-learn's bundled handwritten digits: 1797 8x8 grayscale images, values 0..16.

The data ship inside scikit-learn (the UCI optdigits test set), so this needs no files and no
network: the quickest real data set for smoke tests and CI.

Split: a fixed permutation from ``numpy.random.default_rng(0)``, independent of the run seed, puts
the first 1500 permuted samples in train and the remaining 297 in test. A fixed split keeps test
accuracy comparable across runs with different seeds; permuting (rather than taking the last 297
rows) keeps every class in the test split without relying on the order of the bundled rows.
"""

from __future__ import annotations

import numpy as np
import torch

from tether.data.dataset import ArrayDataset, standardize

NUM_TEST = 297
SPLIT_SEED = 0


def load_digits_dataset() -> ArrayDataset:
    """Digits: 1500 train / 297 test images of shape (1, 8, 8), 10 classes, normalized."""
    # Imported here: scikit-learn takes about a second to import, and most runs never need it.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float32)[:, None]  # (1797, 1, 8, 8)
    labels = np.asarray(bunch.target, dtype=np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    train, test = order[:-NUM_TEST], order[-NUM_TEST:]
    tx, vx = standardize(images[train], images[test])
    return ArrayDataset(
        name="digits",
        train_x=tx,
        train_y=torch.from_numpy(labels[train]),
        test_x=vx,
        test_y=torch.from_numpy(labels[test]),
        num_classes=10,
    )
