"""CIFAR-10 binary reader on small files written in the real record format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tether.data import check_dataset, load_dataset
from tether.data.cifar import RECORD, TEST_FILE, TRAIN_FILES, read_cifar10
from tether.errors import TetherError


def write_batch(path: Path, labels: np.ndarray, images: np.ndarray) -> None:
    """Records of 1 label byte + 3072 pixel bytes (images given as (N, 3, 32, 32), CHW)."""
    n = len(labels)
    rec = np.empty((n, RECORD), dtype=np.uint8)
    rec[:, 0] = labels
    rec[:, 1:] = images.reshape(n, -1)
    path.write_bytes(rec.tobytes())


def write_cifar(d: Path, per_file: int = 3) -> None:
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for name in (*TRAIN_FILES, TEST_FILE):
        labels = rng.integers(0, 10, per_file).astype(np.uint8)
        write_batch(d / name, labels, rng.integers(0, 256, (per_file, 3, 32, 32), np.uint8))


def test_known_pixel_and_label_land_in_place(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    # Overwrite record 1 of data_batch_2 by hand, byte offsets computed from the format itself:
    # label at byte 0; pixel (c, h, w) at byte 1 + c*1024 + h*32 + w.
    raw = bytearray((tmp_path / "data_batch_2.bin").read_bytes())
    base = 1 * RECORD
    raw[base] = 7
    raw[base + 1 + 2 * 1024 + 5 * 32 + 9] = 201  # blue channel, row 5, column 9
    raw[base + 1 + 0 * 1024 + 31 * 32 + 0] = 13  # red channel, row 31, column 0
    (tmp_path / "data_batch_2.bin").write_bytes(bytes(raw))

    train_x, train_y, test_x, _ = read_cifar10(tmp_path)
    assert train_x.shape == (15, 3, 32, 32) and test_x.shape == (3, 3, 32, 32)
    idx = 3 + 1  # data_batch_1 holds 3 records, so record 1 of batch 2 is sample 4
    assert train_y[idx] == 7
    assert train_x[idx, 2, 5, 9] == 201
    assert train_x[idx, 0, 31, 0] == 13

    ds = load_dataset("cifar10", tmp_path)
    assert ds.sample_shape == (3, 32, 32) and ds.num_train == 15 and ds.num_test == 3
    assert int(ds.train_y[idx]) == 7
    # Normalized per channel on train: each channel has mean ~0.
    assert ds.train_x.mean(dim=(0, 2, 3)).abs().max() < 1e-4


def test_subfolder_is_accepted(tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar-10-batches-bin")
    check_dataset("cifar10", tmp_path)
    assert load_dataset("cifar10", tmp_path).num_test == 3


def test_bad_record_size_names_file(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    bad = tmp_path / "data_batch_3.bin"
    bad.write_bytes(bad.read_bytes()[:-10])
    with pytest.raises(TetherError) as info:
        check_dataset("cifar10", tmp_path)
    assert str(bad) in str(info.value) and "3073" in str(info.value)


def test_bad_label_names_file(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    bad = tmp_path / TEST_FILE
    write_batch(bad, np.array([1, 12], np.uint8), np.zeros((2, 3, 32, 32), np.uint8))
    with pytest.raises(TetherError, match=r"test_batch\.bin: label 12"):
        load_dataset("cifar10", tmp_path)


def test_missing_says_how_to_get_it(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    (tmp_path / "data_batch_5.bin").unlink()
    with pytest.raises(TetherError) as info:
        check_dataset("cifar10", tmp_path)
    msg = str(info.value)
    assert "missing data_batch_5.bin" in msg and str(tmp_path) in msg
    assert "https://www.cs.toronto.edu/~kriz/cifar.html" in msg and "--data-dir" in msg
    with pytest.raises(TetherError, match="no default location"):
        check_dataset("cifar10", None)
