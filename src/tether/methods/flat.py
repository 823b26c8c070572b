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

from tether.errors import TetherError


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def check_one_buffer(model: nn.Module, method: str, trainable_only: bool = False) -> None:
    """Refuse, in one line, a model whose parameters cannot live in one flat buffer: one vector
    has one dtype and one device (a float32 layer beside a float64 one would otherwise fail as
    an assertion here, or as autograd's grad_dtype error in sync-sgd's gradient buckets, which
    hold only the ``trainable_only`` parameters)."""
    kinds: dict[tuple[torch.dtype, torch.device], list[str]] = {}
    for name, param in model.named_parameters():
        if param.requires_grad or not trainable_only:
            kinds.setdefault((param.dtype, param.device), []).append(name)
    if len(kinds) <= 1:
        return
    found = " and ".join(
        f"{str(dtype).removeprefix('torch.')} on {device} ({_some(names)})"
        for (dtype, device), names in kinds.items()
    )
    one_device = len({device for _, device in kinds}) == 1
    one_dtype = len({dtype for dtype, _ in kinds}) == 1
    fix = "model.float()" if one_device else "model.to(device)" if one_dtype else ""
    fix = fix or "model.to(device, torch.float32)"
    which = "trainable parameters" if trainable_only else "parameters"
    raise TetherError(
        f"{method} packs the model's {which} into one flat buffer, which needs one dtype and "
        f"one device, but they are {found}: convert the model first (e.g. {fix}; cast inside "
        "forward where a layer needs another dtype)"
    )


def _some(names: list[str]) -> str:
    return ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")


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
