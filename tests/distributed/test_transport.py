"""The header-checked point-to-point protocol on a real gloo group of 3 ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tether.comm.header import MessageHeader, MessageKind, ProtocolError
from tether.comm.transport import HEADER_TAG, TorchTransport
from tether.launch.spawn import run_spawned


def _protocol(rank: int, world: int) -> dict:
    transport = TorchTransport()
    out: dict = {}
    if rank == 0:
        buffer = torch.zeros(16)
        senders = []
        for _ in range(2):  # first come, first served: whichever worker is ready first
            msg = transport.recv_message(buffer, src=None, kinds=frozenset({MessageKind.GRADIENT}))
            senders.append(msg.header.sender)
            assert torch.equal(
                msg.payload, torch.full((msg.header.sender + 3,), float(msg.header.sender))
            )
            assert msg.header.step == 10 * msg.header.sender
        out["senders"] = sorted(senders)
        # Rank 2 forges headers on the header tag only after this: any earlier, an any-source
        # receive above could take a forged header before rank 1's gradient (seen once in a full run).
        transport.send_message(torch.empty(0), 2, MessageKind.STOP)
        transport.send_message(torch.arange(5.0), dst=1, kind=MessageKind.PARAMS, step=1)
        errors = []
        for _ in range(2):  # two forged headers from rank 2, refused before any payload read
            try:
                transport.recv_message(buffer, src=2)
            except ProtocolError as exc:
                errors.append(str(exc))
        out["errors"] = errors
        empty = transport.recv_message(buffer, src=1, kinds=frozenset({MessageKind.STOP}))
        out["stop_length"] = empty.header.length
    else:
        payload = torch.full((rank + 3,), float(rank))
        transport.isend_message(payload, 0, MessageKind.GRADIENT, step=10 * rank).wait()
        if rank == 1:
            msg = transport.recv_message(torch.zeros(8), src=0)
            out["params"] = msg.payload.clone()
            transport.send_message(torch.empty(0), 0, MessageKind.STOP)
        else:
            transport.recv_message(torch.zeros(1), src=0, kinds=frozenset({MessageKind.STOP}))
            too_long = MessageHeader(MessageKind.PARAMS, 2, 0, 10**9, torch.float32).encode()
            dist.send(too_long, dst=0, tag=HEADER_TAG)
            wrong_type = MessageHeader(MessageKind.PARAMS, 2, 0, 4, torch.float64).encode()
            dist.send(wrong_type, dst=0, tag=HEADER_TAG)
    return out


def test_any_source_receive_and_header_validation() -> None:
    root, one, _ = run_spawned(_protocol, 3, timeout_s=20)
    assert root["senders"] == [1, 2]
    assert one["params"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert "announces 1000000000 elements, buffer holds 16" in root["errors"][0]
    assert "carries torch.float64, this side expects torch.float32" in root["errors"][1]
    assert root["stop_length"] == 0
