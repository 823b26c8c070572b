"""Backend and device choice per rank (tether.launch.worker.resolve_backend): NCCL needs a GPU
per rank on the node, so ``auto`` falls back to gloo where there are fewer, and an explicit
``nccl`` is refused in one line. The GPU count is faked: CI has none."""

from __future__ import annotations

import pytest
import torch

from tether.errors import TetherError
from tether.launch.worker import resolve_backend


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    def set_count(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return set_count


def test_auto_uses_nccl_only_with_a_gpu_per_rank(gpus) -> None:
    gpus(0)
    assert resolve_backend("auto", 1) == "gloo"
    gpus(1)
    assert resolve_backend("auto", 1) == "nccl"
    assert resolve_backend("auto", 4) == "gloo"  # 4 ranks cannot share one GPU under NCCL
    gpus(8)
    assert resolve_backend("auto", 4) == "nccl"


def test_explicit_backends(gpus) -> None:
    gpus(1)
    assert resolve_backend("gloo", 4) == "gloo"
    assert resolve_backend("nccl", 1) == "nccl"
    with pytest.raises(TetherError, match="nccl needs one GPU per rank: 2 ranks on this node, 1"):
        resolve_backend("nccl", 2)
