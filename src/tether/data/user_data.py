"""A user's own data set, named by the import path of a loader (``--dataset mypkg.data:load``):
the loader's call and what it returned, checked in one line each, and what a built-in model
needs to know of it (the first sample's shape, the class count where the data says)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

from tether.errors import TetherError, first_line
from tether.imports import load_object


def load_user_data(path: str) -> tuple[Any, Any]:
    """``(train, eval)`` from the loader at import path ``path`` (eval may be None)."""
    loader = load_object(path, "dataset")
    if not callable(loader):
        raise TetherError(f"dataset {path!r} must be a callable returning (train, eval)")
    try:
        loaded = loader()
    except Exception as exc:  # the user's loader: one line (a missing file, a wrong signature)
        raise TetherError(f"dataset {path!r} failed: {first_line(exc)}") from None
    if not (isinstance(loaded, tuple | list) and len(loaded) == 2):
        raise TetherError(
            f"dataset {path!r} must return (train, eval) datasets (eval may be None), "
            f"got a {type(loaded).__name__}"
        )
    train, test = loaded
    for role, part in (("train", train), ("eval", test)):
        if _is_arrays(part):  # (X, y): a "data set" of two samples, X and y
            kinds = " and ".join(type(item).__name__ for item in part)
            raise TetherError(
                f"dataset {path!r} returned {role} as a {type(part).__name__} of "
                f"{kinds}: return a torch.utils.data.Dataset, e.g. "
                "TensorDataset(torch.as_tensor(X), torch.as_tensor(y))"
            )
    return train, test


def _is_arrays(part: Any) -> bool:
    """``(X, y)``: arrays (of as many rows, more than two) where a data set was due."""
    if not (isinstance(part, tuple | list) and len(part) == 2):
        return False
    shapes: list[Any] = [getattr(item, "shape", None) for item in part]
    if not all(shapes):  # not arrays, or 0-d ones: a list of two samples, say
        return False
    return bool(shapes[0][0] == shapes[1][0] > 2)


def infer_shape_and_classes(train: Any) -> tuple[tuple[int, ...], int | None]:
    """The first sample's input shape, and the class count where the dataset tells it
    (``num_classes``, ``classes``, or integer labels of a TensorDataset)."""
    shape: tuple[int, ...] = ()
    try:
        first = train[0]
        inputs = first[0] if isinstance(first, tuple | list) else first
        if isinstance(inputs, torch.Tensor):
            shape = tuple(int(d) for d in inputs.shape)
    except Exception:  # an unusual dataset: a built-in model cannot be sized for it
        shape = ()
    classes = getattr(train, "num_classes", None)
    if classes is None and hasattr(train, "classes"):
        classes = len(train.classes)
    if classes is None and isinstance(train, TensorDataset) and len(train.tensors) == 2:
        labels = train.tensors[1]
        if not labels.is_floating_point() and labels.numel():
            classes = int(labels.max()) + 1
    return shape, classes
