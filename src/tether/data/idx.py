"""IDX files (the MNIST / Fashion-MNIST format) in pure numpy.

Format (LeCun et al., http://yann.lecun.com/exdb/mnist/): two zero bytes, a dtype code, the number
of dimensions, then one big-endian uint32 per dimension, then the payload in big-endian C order.
The header is checked before it is trusted, and the payload length must match it exactly: a
truncated download would otherwise turn into a silently short data set or a numpy reshape error.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np
import torch

from tether.data.dataset import ArrayDataset, standardize
from tether.errors import TetherError

# IDX dtype code -> big-endian numpy dtype.
IDX_DTYPES: dict[int, str] = {
    0x08: ">u1",
    0x09: ">i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}

_FIX = (
    "re-install the data set (for Fashion-MNIST: apt-get install --reinstall "
    "dataset-fashion-mnist) or fix --data-dir"
)

# The four files of an MNIST-like set, by role. Some archives extract with a dot instead of the
# dash before "idx" (train-images.idx3-ubyte), so both spellings are looked for.
MNIST_FILES: dict[str, str] = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}

_DISPLAY = {"fashion-mnist": "Fashion-MNIST", "mnist": "MNIST"}


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TetherError(
            f"cannot read IDX file {path}: {e.strerror or e}; fix --data-dir"
        ) from None
    if path.suffix != ".gz":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        # BadGzipFile is an OSError; a truncated stream is an EOFError; a bad block is zlib.error.
        raise TetherError(f"corrupt IDX file {path}: bad gzip data ({e}); {_FIX}") from None


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (plain, or gzip when the name ends in ``.gz``) into a numpy array.

    The result is writable and in native byte order. Any header or length mismatch is a
    :class:`TetherError` naming the file.
    """
    path = Path(path)
    buf = _read_bytes(path)
    if len(buf) < 4:
        raise TetherError(f"corrupt IDX file {path}: only {len(buf)} bytes, no header; {_FIX}")
    zero0, zero1, code, ndim = buf[0], buf[1], buf[2], buf[3]
    if zero0 != 0 or zero1 != 0 or code not in IDX_DTYPES:
        raise TetherError(
            f"not an IDX file {path}: bad magic {buf[:4].hex()} (want 0000 + dtype code "
            f"08/09/0b/0c/0d/0e + ndim); {_FIX}"
        )
    if not 1 <= ndim <= 4:
        raise TetherError(f"corrupt IDX file {path}: {ndim} dimensions, expected 1..4; {_FIX}")
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise TetherError(f"corrupt IDX file {path}: header truncated ({len(buf)} bytes); {_FIX}")
    dims = tuple(int(d) for d in np.frombuffer(buf, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(IDX_DTYPES[code])
    expected = math.prod(dims) * dtype.itemsize
    found = len(buf) - header
    if found != expected:
        raise TetherError(
            f"corrupt IDX file {path}: expected {expected} payload bytes for shape {dims}, "
            f"found {found}; {_FIX}"
        )
    arr = np.frombuffer(buf, dtype=dtype, offset=header).reshape(dims)
    # astype copies: the buffer is immutable bytes, and callers want native-order, writable data.
    return arr.astype(dtype.newbyteorder("="))


def _find(data_dir: Path, stem: str) -> Path | None:
    """The file for ``stem``: uncompressed first (no decompression cost), then ``.gz``."""
    dotted = stem.replace("-idx", ".idx", 1)
    for name in (stem, dotted, stem + ".gz", dotted + ".gz"):
        p = data_dir / name
        if p.is_file():
            return p
    return None


def locate_mnist_like(data_dir: Path, name: str, hint: str) -> dict[str, Path]:
    """Paths of the four IDX files, or a TetherError saying where it looked and how to get them."""
    found = {role: _find(data_dir, stem) for role, stem in MNIST_FILES.items()}
    missing = [MNIST_FILES[r] + "[.gz]" for r, p in found.items() if p is None]
    if missing:
        display = _DISPLAY.get(name, name)
        raise TetherError(
            f"{display} not found in {data_dir} (missing {', '.join(missing)}): {hint}"
        )
    return {r: p for r, p in found.items() if p is not None}


def read_mnist_like(
    data_dir: Path, name: str, hint: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw uint8 ``(train_x, train_y, test_x, test_y)``, validated; images are ``(N, H, W)``."""
    paths = locate_mnist_like(data_dir, name, hint)
    arrays = {role: read_idx(p) for role, p in paths.items()}
    for split in ("train", "test"):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        px, py = paths[f"{split}_x"], paths[f"{split}_y"]
        if x.dtype != np.uint8 or x.ndim != 3:
            raise TetherError(
                f"unexpected IDX images {px}: {x.dtype} of shape {x.shape}, want uint8 (N, H, W); {_FIX}"
            )
        if y.dtype != np.uint8 or y.ndim != 1:
            raise TetherError(
                f"unexpected IDX labels {py}: {y.dtype} of shape {y.shape}, want uint8 (N,); {_FIX}"
            )
        if x.shape[0] != y.shape[0]:
            raise TetherError(
                f"{px} has {x.shape[0]} images but {py} has {y.shape[0]} labels; {_FIX}"
            )
        if y.size and int(y.max()) > 9:
            raise TetherError(f"bad labels in {py}: found {int(y.max())}, want 0..9; {_FIX}")
    if arrays["train_x"].shape[1:] != arrays["test_x"].shape[1:]:
        raise TetherError(
            f"train and test images differ in size in {data_dir}: "
            f"{arrays['train_x'].shape[1:]} vs {arrays['test_x'].shape[1:]}; {_FIX}"
        )
    return arrays["train_x"], arrays["train_y"], arrays["test_x"], arrays["test_y"]


def load_mnist_like(
    data_dir: Path, name: str, hint: str = "pass --data-dir DIR holding the IDX files"
) -> ArrayDataset:
    """Load an MNIST-format data set (MNIST, Fashion-MNIST) from the four IDX files in ``data_dir``.

    ``hint`` ends the not-found message: how to get this particular data set.
    """
    train_x, train_y, test_x, test_y = read_mnist_like(Path(data_dir), name, hint)
    # (N, H, W) -> (N, 1, H, W): one grayscale channel.
    tx, vx = standardize(train_x[:, None], test_x[:, None])
    return ArrayDataset(
        name=name,
        train_x=tx,
        train_y=torch.from_numpy(train_y.astype(np.int64)),
        test_x=vx,
        test_y=torch.from_numpy(test_y.astype(np.int64)),
        num_classes=10,
    )
