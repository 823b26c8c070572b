"""All of a model's parameters as views into one contiguous flat vector.

The paper's "single-layer communication" (You, Buluc, Demmel, SC17, section 5.1): pack every layer
into one buffer so that an exchange of the whole model is ONE message, and the elastic update
``x <- x - alpha * (x - c)`` is one vectorised operation instead of one per layer. After
:func:`flatten_parameters`, ``param.data`` of every parameter is a view into the returned vector,
so the model's forward pass reads the flat vector and writing the vector moves the model.
"""

from __future__ import annotations

import torch
from torch import nn


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flatten_parameters(model: nn.Module, storage: torch.Tensor | None = None) -> torch.Tensor:
    """Re-home every parameter of ``model`` into one flat vector and return it.

    With ``storage`` (e.g. a shared-memory tensor) the parameters become views into it and take
    its current contents; otherwise a new vector is allocated holding the current weights.
    """
    params = list(model.parameters())
    dtype, device = params[0].dtype, params[0].device
    assert all(p.dtype == dtype and p.device == device for p in params), "one dtype and device"
    total = sum(p.numel() for p in params)
    if storage is None:
        storage = torch.cat([p.detach().reshape(-1) for p in params])
    assert storage.numel() == total and storage.dtype == dtype, "storage must fit the model"
    offset = 0
    for p in params:
        p.data = storage[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return storage


def flat_gradient(model: nn.Module) -> torch.Tensor:
    """The gradients of all parameters as one new flat vector (zeros for unused parameters)."""
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in model.parameters()
        ]
    )
