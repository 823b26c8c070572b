"""The data set registry, ArrayDataset, digits and synthetic data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tether.data import DATASETS, ArrayDataset, check_dataset, load_dataset
from tether.data.synthetic import make_synthetic
from tether.errors import TetherError


def test_registry_names() -> None:
    assert set(DATASETS.names()) == {"fashion-mnist", "mnist", "cifar10", "digits", "synthetic"}
    for name in DATASETS.names():
        assert DATASETS.describe(name)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(TetherError) as info:
        load_dataset("imagenet", None)
    msg = str(info.value)
    assert "imagenet" in msg
    assert all(n in msg for n in DATASETS.names())
    with pytest.raises(TetherError, match="fashion-mnist"):
        check_dataset("fashion", None)


@pytest.mark.parametrize("name", ["fashion-mnist", "mnist"])
def test_missing_data_dir_says_how_to_get_it(tmp_path: Path, name: str) -> None:
    nowhere = tmp_path / "nope"
    with pytest.raises(TetherError) as info:
        check_dataset(name, nowhere)
    msg = str(info.value)
    assert str(nowhere) in msg and "--data-dir" in msg and "train-images-idx3-ubyte" in msg
    if name == "fashion-mnist":
        assert "apt-get install dataset-fashion-mnist" in msg
    with pytest.raises(TetherError):
        load_dataset(name, nowhere)


def test_digits() -> None:
    ds = load_dataset("digits", None)
    assert ds.name == "digits" and ds.num_classes == 10
    assert ds.train_x.shape == (1500, 1, 8, 8) and ds.test_x.shape == (297, 1, 8, 8)
    assert ds.sample_shape == (1, 8, 8)
    assert ds.train_y.dtype == torch.int64 and set(ds.test_y.tolist()) == set(range(10))
    assert abs(float(ds.train_x.mean())) < 1e-5
    again = load_dataset("digits", None, seed=123)  # the split does not depend on the run seed
    assert torch.equal(ds.test_y, again.test_y) and torch.equal(ds.test_x, again.test_x)


def test_data_dir_for_fileless_set_warns(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="no effect"):
        check_dataset("digits", tmp_path)


def test_synthetic_determinism() -> None:
    a = load_dataset("synthetic", None, seed=1)
    b = load_dataset("synthetic", None, seed=1)
    c = load_dataset("synthetic", None, seed=2)
    assert a.train_x.shape == (8192, 1, 28, 28) and a.test_x.shape == (2048, 1, 28, 28)
    for x, y in ((a.train_x, b.train_x), (a.train_y, b.train_y), (a.test_x, b.test_x)):
        assert torch.equal(x, y)
    assert not torch.equal(a.train_x, c.train_x)
    assert not torch.equal(a.train_y, c.train_y)


def test_synthetic_is_learnable_by_a_linear_rule() -> None:
    ds = make_synthetic(seed=0, num_train=2000, num_test=1000)
    # Nearest class mean is a linear classifier; chance is 10%.
    x, xt = ds.train_x.flatten(1), ds.test_x.flatten(1)
    centroids = torch.stack([x[ds.train_y == k].mean(0) for k in range(10)])
    acc = (torch.cdist(xt, centroids).argmin(1) == ds.test_y).float().mean()
    assert acc > 0.5, acc


def test_array_dataset_checks_invariants() -> None:
    x, y = torch.zeros(4, 1, 2, 2), torch.zeros(4, dtype=torch.int64)
    ds = ArrayDataset("t", x, y, x[:2], y[:2], num_classes=3)
    assert ds.sample_shape == (1, 2, 2) and "train=4" in repr(ds)
    with pytest.raises(AssertionError):
        ArrayDataset("t", x, y[:3], x, y, num_classes=3)
    with pytest.raises(AssertionError):
        ArrayDataset("t", x.double(), y, x, y, num_classes=3)
