"""Which dtype forward and backward compute in, on which device."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tether.errors import TetherError

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """``fp32`` (nothing changes), ``bf16`` or ``fp16`` (autocast: matrix products and
    convolutions in that dtype, reductions and the loss in fp32; the weights stay fp32)."""

    name: str = "fp32"

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise TetherError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.name!r}"
            )

    @property
    def dtype(self) -> torch.dtype | None:
        return PRECISIONS[self.name]

    @property
    def scales_loss(self) -> bool:
        """fp16's range (6e-5 to 65504) needs the loss scaled; bf16 has fp32's range."""
        return self.name == "fp16"

    @contextlib.contextmanager
    def autocast(self, device: torch.device) -> Iterator[None]:
        """Forward (and, through autograd, backward) in this precision on ``device``."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=device.type, dtype=self.dtype):
            yield
