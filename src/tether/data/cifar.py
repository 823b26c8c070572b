"""CIFAR-10 from its binary batches (Krizhevsky, 2009, https://www.cs.toronto.edu/~kriz/cifar.html).

Each ``*.bin`` file is a run of 3073-byte records: one label byte, then 3072 pixel bytes in CHW
order (1024 red, 1024 green, 1024 blue, each row-major 32x32). The real files hold 10000 records
each; any whole number of records is accepted so tests can write small files in the same format.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tether.data.dataset import ArrayDataset, standardize
from tether.errors import TetherError

RECORD = 1 + 3 * 32 * 32
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"
SUBDIR = "cifar-10-batches-bin"  # what extracting cifar-10-binary.tar.gz creates

HOW_TO_GET = (
    "download cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html on a "
    "machine with network, extract it (tar xzf cifar-10-binary.tar.gz) and pass --data-dir DIR "
    f"(DIR holding data_batch_1.bin ... test_batch.bin, or their {SUBDIR}/ folder)"
)
_FIX = "re-download and extract cifar-10-binary.tar.gz or fix --data-dir"


def locate_cifar10(data_dir: Path) -> Path:
    """The folder holding the six batch files: ``data_dir`` itself or its ``cifar-10-batches-bin``."""
    names = (*TRAIN_FILES, TEST_FILE)
    for folder in (data_dir, data_dir / SUBDIR):
        if all((folder / n).is_file() for n in names):
            return folder
    # Name what is missing in the more complete of the two candidates, to make the fix obvious.
    best = max((data_dir, data_dir / SUBDIR), key=lambda f: sum((f / n).is_file() for n in names))
    missing = [n for n in names if not (best / n).is_file()]
    extra = ""
    if (data_dir / "cifar-10-binary.tar.gz").is_file():
        extra = f" (found {data_dir / 'cifar-10-binary.tar.gz'}: extract it first)"
    raise TetherError(
        f"CIFAR-10 not found in {data_dir} (missing {', '.join(missing)}){extra}: {HOW_TO_GET}"
    )


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One binary batch as ``(images uint8 (N, 3, 32, 32), labels uint8 (N,))``, validated."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise TetherError(f"cannot read CIFAR-10 file {path}: {e}; fix --data-dir") from None
    if raw.size == 0 or raw.size % RECORD != 0:
        raise TetherError(
            f"corrupt CIFAR-10 file {path}: {raw.size} bytes is not a whole number of "
            f"{RECORD}-byte records (1 label + 3072 pixels); {_FIX}"
        )
    records = raw.reshape(-1, RECORD)
    labels = records[:, 0].copy()
    if int(labels.max()) > 9:
        raise TetherError(
            f"corrupt CIFAR-10 file {path}: label {int(labels.max())} outside 0..9; {_FIX}"
        )
    images = records[:, 1:].reshape(-1, 3, 32, 32)
    return images, labels


def read_cifar10(data_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw uint8 ``(train_x, train_y, test_x, test_y)`` from all six batches."""
    folder = locate_cifar10(Path(data_dir))
    train = [read_cifar_batch(folder / n) for n in TRAIN_FILES]
    test_x, test_y = read_cifar_batch(folder / TEST_FILE)
    train_x = np.concatenate([x for x, _ in train])
    train_y = np.concatenate([y for _, y in train])
    return train_x, train_y, test_x, test_y


def check_cifar10(data_dir: Path) -> int:
    """Validate presence, record sizes and labels without the float conversion; returns the
    number of training images."""
    return len(read_cifar10(data_dir)[0])


def load_cifar10(data_dir: Path) -> ArrayDataset:
    """CIFAR-10: 50000 train / 10000 test RGB 32x32 images, 10 classes, normalized per channel."""
    train_x, train_y, test_x, test_y = read_cifar10(data_dir)
    tx, vx = standardize(train_x, test_x)
    return ArrayDataset(
        name="cifar10",
        train_x=tx,
        train_y=torch.from_numpy(train_y.astype(np.int64)),
        test_x=vx,
        test_y=torch.from_numpy(test_y.astype(np.int64)),
        num_classes=10,
    )
