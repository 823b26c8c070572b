"""IDX reader and the MNIST-like loader, on small files written here and on the real set."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from tether.data import read_idx
from tether.data.idx import IDX_DTYPES, load_mnist_like
from tether.errors import TetherError

FASHION = Path("/usr/share/datasets/fashion-mnist")
CODES = {np.dtype(v).newbyteorder("="): k for k, v in IDX_DTYPES.items()}


def idx_bytes(arr: np.ndarray) -> bytes:
    """Encode ``arr`` as IDX: the independent writer the reader is checked against."""
    code = CODES[arr.dtype]
    header = bytes([0, 0, code, arr.ndim]) + np.array(arr.shape, dtype=">u4").tobytes()
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, arr: np.ndarray) -> Path:
    data = idx_bytes(arr)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize(
    "arr",
    [
        np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        np.array([-3, 0, 7], dtype=np.int8),
        np.array([[1, -2], [300, -400]], dtype=np.int16),
        np.array([1, -(2**31), 2**31 - 1], dtype=np.int32),
        np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 2, 3),
        np.array([np.pi, -np.e], dtype=np.float64).reshape(1, 1, 1, 2),
    ],
    ids=["ubyte3d", "sbyte", "short", "int", "float3d", "double4d"],
)
def test_idx_round_trip(tmp_path: Path, suffix: str, arr: np.ndarray) -> None:
    out = read_idx(write_idx(tmp_path / f"a-idx{suffix}", arr))
    assert out.dtype == arr.dtype and out.dtype.isnative
    assert out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)
    assert out.flags.writeable


def _expect_error(path: Path, *words: str) -> str:
    with pytest.raises(TetherError) as info:
        read_idx(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    for w in words:
        assert w in msg, msg
    assert "\n" not in msg
    return msg


def test_truncated_payload(tmp_path: Path) -> None:
    data = idx_bytes(np.zeros((10, 28, 28), dtype=np.uint8))
    p = tmp_path / "train-images-idx3-ubyte"
    p.write_bytes(data[:1000])
    _expect_error(p, "expected 7840 payload bytes", f"found {1000 - 16}", "--data-dir")


def test_trailing_bytes(tmp_path: Path) -> None:
    p = tmp_path / "x.idx"
    p.write_bytes(idx_bytes(np.zeros(5, dtype=np.uint8)) + b"\0")
    _expect_error(p, "expected 5 payload bytes", "found 6")


@pytest.mark.parametrize(
    "header",
    [b"\x00\x01\x08\x01", b"\x01\x00\x08\x01", b"\x00\x00\x0a\x01", b"\x00\x00\x08\x00"],
    ids=["nonzero-byte-1", "nonzero-byte-0", "bad-dtype", "ndim-0"],
)
def test_bad_magic(tmp_path: Path, header: bytes) -> None:
    p = tmp_path / "bad.idx"
    p.write_bytes(header + b"\x00\x00\x00\x01" + b"\x07")
    _expect_error(p)


def test_too_many_dims_and_short_header(tmp_path: Path) -> None:
    p = tmp_path / "five.idx"
    p.write_bytes(b"\x00\x00\x08\x05" + b"\x00\x00\x00\x01" * 5 + b"\x00")
    _expect_error(p, "5 dimensions")
    p = tmp_path / "short.idx"
    p.write_bytes(b"\x00\x00\x08\x03\x00\x00")
    _expect_error(p, "header truncated")
    p = tmp_path / "tiny.idx"
    p.write_bytes(b"\x00\x00")
    _expect_error(p, "no header")


def test_truncated_and_garbled_gzip(tmp_path: Path) -> None:
    good = gzip.compress(idx_bytes(np.arange(1000, dtype=np.uint8)))
    p = tmp_path / "cut.gz"
    p.write_bytes(good[: len(good) // 2])
    _expect_error(p, "gzip")
    p = tmp_path / "garbled.gz"
    p.write_bytes(b"this is not gzip at all")
    _expect_error(p, "gzip")


def test_missing_file(tmp_path: Path) -> None:
    _expect_error(tmp_path / "nope-idx1-ubyte", "cannot read")


def write_mnist_like(d: Path, n_train: int = 12, n_test: int = 5, gz: bool = True) -> None:
    rng = np.random.default_rng(0)
    ext = ".gz" if gz else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(d / f"{prefix}-images-idx3-ubyte{ext}", rng.integers(0, 256, (n, 6, 5), np.uint8))
        write_idx(d / f"{prefix}-labels-idx1-ubyte{ext}", rng.integers(0, 10, n).astype(np.uint8))


def test_load_mnist_like_small(tmp_path: Path) -> None:
    write_mnist_like(tmp_path)
    ds = load_mnist_like(tmp_path, "mnist")
    assert ds.sample_shape == (1, 6, 5)
    assert (ds.num_train, ds.num_test, ds.num_classes) == (12, 5, 10)
    raw = read_idx(tmp_path / "train-labels-idx1-ubyte.gz")
    np.testing.assert_array_equal(ds.train_y.numpy(), raw)
    assert abs(float(ds.train_x.mean())) < 1e-5
    assert abs(float(ds.train_x.std(unbiased=False)) - 1) < 1e-4


def test_load_mnist_like_prefers_uncompressed(tmp_path: Path) -> None:
    write_mnist_like(tmp_path, n_train=12, gz=True)
    write_mnist_like(tmp_path, n_train=7, gz=False)
    assert load_mnist_like(tmp_path, "mnist").num_train == 7


def test_load_mnist_like_count_mismatch(tmp_path: Path) -> None:
    write_mnist_like(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.zeros(4, dtype=np.uint8))
    with pytest.raises(TetherError, match=r"5 images but .* has 4 labels"):
        load_mnist_like(tmp_path, "mnist")


def test_load_mnist_like_bad_label(tmp_path: Path) -> None:
    write_mnist_like(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.full(12, 10, dtype=np.uint8))
    with pytest.raises(TetherError, match=r"train-labels-idx1-ubyte\.gz: found 10"):
        load_mnist_like(tmp_path, "mnist")


def test_load_mnist_like_missing_names_files(tmp_path: Path) -> None:
    write_mnist_like(tmp_path)
    (tmp_path / "t10k-images-idx3-ubyte.gz").unlink()
    with pytest.raises(TetherError) as info:
        load_mnist_like(tmp_path, "fashion-mnist", hint="do X")
    msg = str(info.value)
    assert "Fashion-MNIST not found in" in msg and str(tmp_path) in msg
    assert "t10k-images-idx3-ubyte[.gz]" in msg and msg.endswith("do X")
    assert "train-images" not in msg  # only what is actually missing


@pytest.mark.skipif(
    not (FASHION / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist() -> None:
    import torch

    from tether.data import load_dataset

    ds = load_dataset("fashion-mnist", None)
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert ds.train_y.shape == (60000,) and ds.test_y.shape == (10000,)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert torch.equal(ds.train_y.bincount(), torch.full((10,), 6000))
    assert torch.equal(ds.test_y.bincount(), torch.full((10,), 1000))
    assert abs(float(ds.train_x.mean())) < 1e-3 and abs(float(ds.train_x.std()) - 1) < 1e-3
    assert abs(float(ds.test_x.mean())) < 0.05 and abs(float(ds.test_x.std()) - 1) < 0.05
