"""Every method keeps a model's parameters in one flat buffer (tether.methods.flat), which has one
dtype and one device: a model mixing float32 and float64 layers used to fail as a bare
``AssertionError: one dtype and device`` (or, under sync-sgd, as autograd's grad_dtype error in
the middle of the first backward pass). Now building any method refuses it in one line that
names what it found and the fix. The check runs before the method touches its transport, so no
process group is needed here."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tether.config import TrainConfig
from tether.errors import TetherError
from tether.methods import METHODS, MethodContext
from tether.methods.flat import check_one_buffer


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2).double()


@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_refuses_mixed_dtypes_in_one_line(method: str) -> None:
    context = MethodContext(TrainConfig(method=method), None, torch.device("cpu"))  # type: ignore[arg-type]
    with pytest.raises(TetherError) as caught:
        METHODS.get(method)(Mixed(), context)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{method} packs the model's")
    assert "float32 on cpu (a.weight, a.bias) and float64 on cpu (b.weight, b.bias)" in message
    assert "model.float()" in message


def test_sync_sgd_buckets_only_trainable_parameters() -> None:
    # a frozen float64 layer is only broadcast under sync-sgd: it stays allowed there
    model = Mixed()
    model.b.requires_grad_(False)
    METHODS.get("sync-sgd").check_model(model)
    with pytest.raises(TetherError, match=r"^local-sgd packs the model's parameters"):
        METHODS.get("local-sgd").check_model(model)


def test_names_a_few_parameters_and_the_device_fix() -> None:
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(3)], nn.Linear(2, 2, device="meta"))
    with pytest.raises(TetherError) as caught:
        check_one_buffer(model, "sync-easgd")
    message = str(caught.value)
    assert "float32 on cpu (0.weight, 0.bias and 4 more) and float32 on meta" in message
    assert "model.to(device)" in message
    model[3].double()
    with pytest.raises(TetherError, match=r"model\.to\(device, torch\.float32\)"):
        check_one_buffer(model, "sync-easgd")
    check_one_buffer(nn.Linear(2, 2), "sync-easgd")  # one dtype, one device: nothing to say
