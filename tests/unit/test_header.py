"""The point-to-point header: every field is validated before a payload is received."""

from __future__ import annotations

import pytest
import torch

from tether.comm.header import MAGIC, MessageHeader, MessageKind, ProtocolError


def _words(**change: int) -> torch.Tensor:
    words = MessageHeader(MessageKind.PARAMS, 2, 7, 100, torch.float32).encode()
    names = ["magic", "kind", "sender", "step", "length", "dtype", "loss", "loss_steps"]
    for name, value in change.items():
        words[names.index(name)] = value
    return words


def _bits(value: float) -> int:
    return int(torch.tensor([value], dtype=torch.float64).view(torch.int64))


def test_round_trip() -> None:
    header = MessageHeader.decode(_words(), 2, 100, torch.float32)
    assert header == MessageHeader(MessageKind.PARAMS, 2, 7, 100, torch.float32)
    assert int(_words()[0]) == MAGIC


@pytest.mark.parametrize("loss", [0.6931, 0.0, float("inf")])
def test_a_workers_loss_rides_on_the_header(loss: float) -> None:
    sent = MessageHeader(MessageKind.GRADIENT, 1, 8, 100, torch.float32, loss, 4)
    got = MessageHeader.decode(sent.encode(), 1, 100, torch.float32)
    assert (got.loss, got.loss_steps) == (loss, 4)  # float64 bits: exact
    nan = MessageHeader(MessageKind.GRADIENT, 1, 8, 100, torch.float32, float("nan"), 2)
    assert MessageHeader.decode(nan.encode(), 1, 100, torch.float32).loss != 0.0  # NaN kept


def test_a_servers_busy_seconds_ride_on_its_reply() -> None:
    # the seconds it spent evaluating and saving so far: its workers' waits for them are no
    # communication (their comm share counted them)
    sent = MessageHeader(MessageKind.PARAMS, 0, 8, 100, torch.float32, 2.5, 0)
    got = MessageHeader.decode(sent.encode(), 0, 100, torch.float32)
    assert got.busy_s == 2.5
    loss = MessageHeader(MessageKind.GRADIENT, 1, 8, 100, torch.float32, 2.5, 3)
    assert MessageHeader.decode(loss.encode(), 1, 100, torch.float32).busy_s == 0.0


@pytest.mark.parametrize(
    ("change", "sender", "kinds", "message"),
    [
        ({"magic": 1}, 2, None, "bad magic"),
        ({"kind": 99}, 2, None, "unknown kind 99"),
        ({}, 2, frozenset({MessageKind.GRADIENT}), "is PARAMS, expected GRADIENT"),
        ({}, 3, None, "from rank 3 claims to come from rank 2"),
        ({"dtype": 42}, 2, None, "unknown dtype code 42"),
        ({"dtype": 2}, 2, None, "carries torch.float64, this side expects torch.float32"),
        ({"length": 101}, 2, None, "announces 101 elements, buffer holds 100"),
        ({"length": -1}, 2, None, "announces -1 elements"),
        ({"step": -1}, 2, None, "has step -1, outside"),
        ({"step": 1 << 41}, 2, None, "has step 2199023255552, outside"),
        ({"loss_steps": -1}, 2, None, "a loss over -1 steps"),
        # over no step, the word is a server's busy seconds: a number of seconds
        ({"loss": _bits(-1.0)}, 2, None, r"says its sender was busy for -1.0 s"),
        ({"loss": _bits(float("nan"))}, 2, None, r"says its sender was busy for nan s"),
    ],
)
def test_bad_headers_are_refused(change, sender, kinds, message) -> None:
    with pytest.raises(ProtocolError, match=message):
        MessageHeader.decode(_words(**change), sender, 100, torch.float32, kinds)
