"""One copy of a data set for every process on a machine: a memory-mapped cache of its arrays.

Every worker trains on the whole data set (it shards by index), so P local workers that each
read and normalize the files hold P copies: 0.2 GB a worker for Fashion-MNIST, 3 GB at 16
workers. Instead the normalized arrays are written once, as raw files, to a cache
directory keyed by the data set's files (names, sizes, modification times), and every process
maps them read-only-in-practice (``torch.from_file(shared=False)``: a private mapping, so the
pages come from the page cache once for all processes, and a write, which nothing of ours does,
would copy only the page it touches). The launcher fills the cache before it starts the workers;
a worker that finds none (under ``torchrun``) loads the files and fills it itself. No pickle:
the arrays are raw bytes, their shapes and dtypes a small JSON file checked against the sizes.

The cache lives in ``$TETHER_DATA_CACHE``, else ``$XDG_CACHE_HOME/tether/data``, else
``~/.cache/tether/data``; ``TETHER_DATA_CACHE=off`` turns it off (every process then loads its
own copy, as before). A directory that cannot be written costs nothing but the sharing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from tether.data.dataset import ArrayDataset

FORMAT = 1  # bump when the normalization or the layout changes: old entries are then not used
ARRAYS = ("train_x", "train_y", "test_x", "test_y")
DTYPES = {"float32": torch.float32, "int64": torch.int64}


def cache_root() -> Path | None:
    """Where cached data sets live (None: the cache is off)."""
    chosen = os.environ.get("TETHER_DATA_CACHE")
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "no") else Path(chosen)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tether" / "data"


def cache_key(name: str, data_dir: Path) -> str:
    """A digest of the data set's name and its files (the folder and its direct sub-folders:
    name, size, modification time): replacing a file gives a new entry."""
    digest = hashlib.sha256(f"{FORMAT}\0{name}\0{data_dir.resolve()}".encode())
    for folder in (data_dir, *sorted(p for p in data_dir.iterdir() if p.is_dir())):
        for path in sorted(folder.iterdir()):
            if path.is_file():
                stat = path.stat()
                digest.update(f"\0{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return f"{name}-{digest.hexdigest()[:20]}"


def open_cached(entry: Path) -> ArrayDataset | None:
    """The data set mapped from a cache entry; None when there is no entry or it does not hold
    what its description says (sizes checked against shapes, dtypes from a fixed list)."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        if meta.get("byteorder") != sys.byteorder:
            return None
        arrays = {}
        for key in ARRAYS:
            shape = [int(d) for d in meta[key]["shape"]]
            dtype = DTYPES[meta[key]["dtype"]]
            count = math.prod(shape)
            path = entry / f"{key}.bin"
            if path.stat().st_size != count * dtype.itemsize:
                return None
            flat = torch.from_file(str(path), shared=False, size=count, dtype=dtype)
            arrays[key] = flat.view(shape)
        return ArrayDataset(name=str(meta["name"]), num_classes=int(meta["num_classes"]), **arrays)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AssertionError):
        return None


def write_cached(data: ArrayDataset, entry: Path) -> None:
    """Write an entry atomically: a private folder renamed into place, so a reader sees a whole
    entry or none; when another process got there first its entry is kept."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        meta: dict[str, object] = {"name": data.name, "num_classes": data.num_classes}
        for key in ARRAYS:
            tensor: torch.Tensor = getattr(data, key).contiguous()
            meta[key] = {"shape": list(tensor.shape), "dtype": str(tensor.dtype).split(".")[1]}
            with open(staging / f"{key}.bin", "wb") as handle:
                handle.write(tensor.numpy().data)  # the machine's byte order, named in meta
        meta["byteorder"] = sys.byteorder
        (staging / "meta.json").write_text(json.dumps(meta))
        os.rename(staging, entry)
    except OSError:
        if not entry.exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_shared(name: str, data_dir: Path, load: Callable[[], ArrayDataset]) -> ArrayDataset:
    """The data set from the cache, filling it first when it has no entry; ``load`` reads the
    files. Without a usable cache, what ``load`` returns."""
    root = cache_root()
    if root is None:
        return load()
    try:
        entry = root / cache_key(name, data_dir)
    except OSError:
        return load()  # the loader names what is wrong with the folder
    cached = open_cached(entry)
    if cached is not None:
        return cached
    if entry.exists():  # damaged (a write is atomic, so not a half-written one): make it anew
        shutil.rmtree(entry, ignore_errors=True)
    data = load()
    try:
        write_cached(data, entry)
    except OSError:
        return data  # a read-only or full cache: this process keeps its own copy
    return open_cached(entry) or data
