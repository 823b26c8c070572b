"""The data sets a user can pick by name, and the two calls the rest of Tether uses.

``load_dataset`` returns an :class:`ArrayDataset`; ``check_dataset`` validates presence and file
headers and is what the CLI calls before it launches workers, so a missing or corrupt data set is
one clear line in the launcher instead of the same traceback from every worker.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tether.data.cache import cache_root, load_shared
from tether.data.cifar import HOW_TO_GET as CIFAR_HOW_TO_GET
from tether.data.cifar import check_cifar10, load_cifar10
from tether.data.dataset import ArrayDataset
from tether.data.digits import load_digits_dataset
from tether.data.idx import load_mnist_like, read_mnist_like
from tether.data.synthetic import make_synthetic
from tether.errors import TetherError
from tether.registry import Registry


@dataclass(frozen=True)
class DatasetSpec:
    """How to load and check one data set.

    ``load(data_dir, seed)`` and ``check(data_dir)`` get the resolved directory (``None`` for data
    sets without files); ``check`` returns the number of training samples. ``default_dir`` is where files are looked for without ``--data-dir``;
    without either, ``no_dir_hint`` is the error message.
    """

    load: Callable[[Path | None, int], ArrayDataset]
    check: Callable[[Path | None], int]
    needs_files: bool
    default_dir: Path | None = None
    no_dir_hint: str = ""  # the error when there is no default_dir and no --data-dir


DATASETS: Registry[DatasetSpec] = Registry("dataset")

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian package dataset-fashion-mnist
MNIST_DIR = Path("/usr/share/datasets/mnist")  # no Debian package today; the path is by analogy

_FASHION_HINT = (
    "install it with `apt-get install dataset-fashion-mnist` or pass --data-dir DIR holding the "
    "IDX files"
)
_MNIST_HINT = (
    "download the four IDX .gz files from an MNIST mirror (e.g. https://ossci-datasets.s3.amazonaws"
    ".com/mnist/) on a machine with network and pass --data-dir DIR holding them"
)


def _need_dir(d: Path | None) -> Path:
    assert d is not None, "data sets with files always get a directory"
    return d


def _mnist_like(name: str, hint: str, default_dir: Path) -> DatasetSpec:
    def load(d: Path | None, seed: int) -> ArrayDataset:
        return load_mnist_like(_need_dir(d), name, hint)

    def check(d: Path | None) -> int:
        train_x, *_ = read_mnist_like(_need_dir(d), name, hint)  # all but the float conversion
        return len(train_x)

    return DatasetSpec(load=load, check=check, needs_files=True, default_dir=default_dir)


DATASETS.register("fashion-mnist", help="Fashion-MNIST: 60000/10000 28x28 grayscale, 10 classes")(
    _mnist_like("fashion-mnist", _FASHION_HINT, FASHION_DIR)
)
DATASETS.register("mnist", help="MNIST: 60000/10000 28x28 grayscale digits, 10 classes")(
    _mnist_like("mnist", _MNIST_HINT, MNIST_DIR)
)
DATASETS.register("cifar10", help="CIFAR-10: 50000/10000 32x32 RGB, 10 classes (binary batches)")(
    DatasetSpec(
        load=lambda d, seed: load_cifar10(_need_dir(d)),
        check=lambda d: check_cifar10(_need_dir(d)),  # returns the training samples
        needs_files=True,
        no_dir_hint=f"CIFAR-10 has no default location; {CIFAR_HOW_TO_GET}",
    )
)
DATASETS.register("digits", help="scikit-learn digits: 1500/297 8x8 grayscale, bundled")(
    DatasetSpec(
        load=lambda d, seed: load_digits_dataset(),
        check=lambda d: len(load_digits_dataset().train_x),
        needs_files=False,
    )
)
DATASETS.register("synthetic", help="synthetic: 8192/2048 1x28x28, 10 classes, from the seed")(
    DatasetSpec(
        load=lambda d, seed: make_synthetic(seed=seed),
        check=lambda d: len(make_synthetic(seed=0).train_x),
        needs_files=False,
    )
)


def _resolve_dir(name: str, spec: DatasetSpec, data_dir: Path | None) -> Path | None:
    if not spec.needs_files:
        if data_dir is not None:
            warnings.warn(
                f"--data-dir {data_dir} has no effect: data set {name!r} needs no files",
                stacklevel=3,
            )
        return None
    if data_dir is not None:
        return Path(data_dir).expanduser()
    if spec.default_dir is not None:
        return spec.default_dir
    raise TetherError(spec.no_dir_hint or f"data set {name!r} needs --data-dir DIR")


def load_dataset(name: str, data_dir: Path | None, seed: int = 0) -> ArrayDataset:
    """Load data set ``name`` (see ``DATASETS.names()``); ``seed`` matters only for "synthetic".
    A data set read from files comes through the machine's shared cache (:mod:`tether.data.cache`:
    one copy mapped by every process)."""
    spec = DATASETS.get(name)
    folder = _resolve_dir(name, spec, data_dir)
    if folder is None:
        return spec.load(folder, seed)
    return load_shared(name, folder, lambda: spec.load(folder, seed))


def check_dataset(name: str, data_dir: Path | None) -> int:
    """Raise a TetherError if ``name`` is unknown, its files are missing, or a header is corrupt;
    returns the number of training samples."""
    spec = DATASETS.get(name)
    return spec.check(_resolve_dir(name, spec, data_dir))


def fill_dataset_cache(name: str, data_dir: Path | None) -> None:
    """Put a data set read from files into the machine's shared cache, if it is not there yet:
    the launcher does it once, so that its workers map one copy instead of each reading the
    files into its own. Data sets without files are made in each process (nothing to share),
    and with the cache off every worker reads its own copy: then the launcher loads nothing."""
    spec = DATASETS.get(name)
    if spec.needs_files and cache_root() is not None:
        load_dataset(name, data_dir)
