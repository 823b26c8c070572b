"""fp16's dynamic loss scaling: torch GradScaler's semantics (back off and skip on inf/NaN,
grow after a run of clean steps), and the precision policy."""

from __future__ import annotations

import pytest
import torch

from tether.errors import TetherError
from tether.precision import LossScaler, Precision, ScalerSettings


def test_the_scale_backs_off_on_overflow_and_grows_after_clean_steps() -> None:
    scaler = LossScaler(ScalerSettings(init_scale=8.0, growth_interval=3))
    grad = torch.tensor([16.0, -8.0])
    assert float(scaler.scale_loss(torch.tensor(1.0))) == 8.0
    assert scaler.unscale([grad]) is False and torch.equal(grad, torch.tensor([2.0, -1.0]))
    scaler.update(False)
    scaler.scale_loss(torch.tensor(1.0))
    assert scaler.unscale([torch.tensor([float("inf")])]) is True
    scaler.update(True)
    assert scaler.scale == 4.0 and scaler.skipped == 1 and scaler.clean_steps == 0
    scaler.scale_loss(torch.tensor(1.0))
    assert scaler.unscale([torch.tensor([float("nan")])]) is True
    for _ in range(3):
        scaler.update(False)
    assert scaler.scale == 8.0  # three clean steps in a row: doubled
    again = LossScaler()
    again.load_state_dict(scaler.state_dict())
    assert again.state_dict() == scaler.state_dict()


def test_a_run_whose_every_step_overflows_is_told_once(capsys) -> None:
    # Before: 30 of 30 steps skipped, the first weights evaluated, status 0 and no word.
    scaler = LossScaler(rank=3)  # 2**16, halved on each overflow
    for _ in range(16):  # down to 1: backing off from a high scale is its normal work
        scaler.update(True)
    scaler.update(False)  # a clean step ends the streak
    for _ in range(7):
        scaler.update(True)
    assert capsys.readouterr().err == ""
    for _ in range(10):
        scaler.update(True)
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "tether: warning: rank 3: fp16: the last 8 steps overflowed (inf or NaN gradients) "
        "and were skipped, the loss scale down to 0.00390625 from 65536: the forward or "
        "backward pass makes values fp16 cannot hold and the model is not training; switch to "
        "bf16 with --precision bf16 (precision='bf16' in Python), or lower the learning rate "
        "if the weights diverged"
    ]


def test_an_overflow_flag_is_shared_when_asked() -> None:
    seen = []

    def share(flag: torch.Tensor) -> None:  # stands in for a MAX all-reduce over the group
        seen.append(float(flag))
        flag.fill_(1.0)  # another rank overflowed

    scaler = LossScaler(share=share)
    scaler.scale_loss(torch.tensor(1.0))
    assert scaler.unscale([torch.tensor([1.0])]) is True and seen == [0.0]


def test_precision_names_and_autocast() -> None:
    layer = torch.nn.Linear(4, 2)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with Precision(name).autocast(torch.device("cpu")):
            assert layer(torch.randn(3, 4)).dtype == dtype
    assert Precision("fp16").scales_loss and not Precision("bf16").scales_loss
    with pytest.raises(TetherError, match="precision must be one of fp32, bf16, fp16"):
        Precision("fp8")
