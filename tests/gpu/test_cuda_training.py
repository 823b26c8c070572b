"""The CUDA paths, on a machine with a GPU (skipped without one; CI has none): training with
the model and batches on the GPU, in a process group of NCCL (CUDA tensors) and gloo (the CPU
control tensors), with per-phase times taken after the device has drained its queue.

One GPU is enough for one NCCL rank (``auto`` keeps several ranks of one GPU on gloo, which the
rest of the suite covers); several GPUs exercise NCCL between ranks."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from tests.conftest import requires_fashion_mnist, run_cli

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    requires_fashion_mnist,
]


def _train(run: Path, *extra: str) -> dict:
    workers = str(min(2, torch.cuda.device_count()))
    args = ["--workers", workers, "--steps", "300", "--eval-every", "150", "--batch-size", "64"]
    args += ["--backend", "nccl", "--no-progress", "--timeout", "60"]
    result = run_cli("train", *args, *extra, "--out", str(run), timeout=300)
    assert result.returncode == 0, result.stderr
    assert tomllib.loads((run / "config.toml").read_text())["backend"] == "nccl"
    return json.loads((run / "summary.json").read_text())


def test_sync_sgd_trains_on_the_gpu(tmp_path: Path) -> None:
    summary = _train(tmp_path / "run", "--method", "sync-sgd", "--timeline")
    assert summary["steps"] == 300
    assert summary["final_test_accuracy"] > 0.7  # LeNet-5, 300 steps of 64: ~0.8
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in records if "event" not in r]
    assert all(r["compute_s"] > 0 for r in steps)
    trace = json.loads((tmp_path / "run" / "timeline.json").read_text())
    assert any(e.get("cat") == "compute" for e in trace["traceEvents"])


@pytest.mark.parametrize(
    "method",
    [
        ["--method", "sync-sgd", "--allreduce", "ring", "--compress", "bf16", "--bucket-mb", "1"],
        ["--method", "local-sgd", "--compress", "fp16"],
        ["--method", "sync-easgd"],
    ],
    ids=["sync-sgd-ring-bf16", "local-sgd-fp16", "sync-easgd"],
)
def test_replicated_methods_train_on_the_gpu(tmp_path: Path, method: list[str]) -> None:
    summary = _train(tmp_path / "run", *method)
    assert summary["final_test_accuracy"] > 0.6, summary["final_test_accuracy"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_trains_on_the_gpu(tmp_path: Path, precision: str) -> None:
    """fp16 with dynamic loss scaling, bf16 without: autocast on CUDA, fp32 weights."""
    summary = _train(tmp_path / "run", "--method", "sync-sgd", "--precision", precision)
    assert summary["final_test_accuracy"] > 0.7, summary["final_test_accuracy"]
