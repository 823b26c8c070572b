"""Forged messages against the real parameter server (ServerEndpoint, first come first served):
a broken or hostile worker is given up alone, while a healthy one is served to its end.

Rank 0 serves, rank 1 is a healthy worker doing 20 exchanges, ranks 2.. each forge one message
after a proper handshake. What gloo itself cannot survive (a message longer than the buffer the
receiver posted aborts the process in gloo's I/O thread) is out of reach here; the server posts
the most it accepts (1024 header words, the whole parameter vector) so that what it can validate,
it validates."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tether.comm.header import HEADER_WORDS, MessageHeader, MessageKind
from tether.comm.messages import message_tags
from tether.comm.transport import TorchTransport
from tether.launch.spawn import run_spawned
from tether.methods.ps_server import DATA_CHANNEL, ServerEndpoint
from tether.methods.ps_worker import WorkerEndpoint
from tether.observe.metrics import PhaseTotals

N = 1000  # parameters
EXCHANGES = 20
SILENCE_S = 3.0
# Rank -> what it forges (after its handshake).
FORGERIES = {
    2: "long header",  # 1000 words on the header tag, the first 6 a valid header
    3: "payload longer than its header",  # header: 500 elements; payload: 1000
    4: "payload shorter than its header",  # header: 1000 elements; payload: 10
    5: "header without payload",  # stalls its own receiver only
    6: "short goodbye",  # a STOP whose totals have 2 words instead of 5
    7: "step jump",  # step 10**6 after step 0
}


def _send_raw(header: MessageHeader, payload: torch.Tensor | None, words: int = 0) -> None:
    header_tag, payload_tag = message_tags(DATA_CHANNEL)
    encoded = header.encode()
    if words:
        padded = torch.full((words,), 7, dtype=torch.int64)
        padded[: encoded.numel()] = encoded
        encoded = padded
    dist.send(encoded, dst=0, tag=header_tag)
    if payload is not None:
        dist.send(payload, dst=0, tag=payload_tag)


def _forge(rank: int, kind: str) -> None:
    gradient = MessageKind.GRADIENT
    if kind == "long header":
        _send_raw(MessageHeader(gradient, rank, 1, N, torch.float32), None, words=1000)
    elif kind == "payload longer than its header":
        _send_raw(MessageHeader(gradient, rank, 1, 500, torch.float32), torch.ones(N))
    elif kind == "payload shorter than its header":
        _send_raw(MessageHeader(gradient, rank, 1, N, torch.float32), torch.full((10,), 3.0))
    elif kind == "header without payload":
        _send_raw(MessageHeader(gradient, rank, 1, N, torch.float32), None)
    elif kind == "short goodbye":
        _send_raw(
            MessageHeader(MessageKind.STOP, rank, 1, 2, torch.float64), torch.ones(2).double()
        )
    elif kind == "step jump":
        _send_raw(MessageHeader(gradient, rank, 10**6, N, torch.float32), torch.ones(N))


def _fuzz(rank: int, world: int) -> dict:
    transport = TorchTransport()
    params = torch.zeros(N)
    if rank == 0:
        server = ServerEndpoint(transport, params, silence_timeout_s=SILENCE_S, max_step_jump=1)
        server.handshake(params)
        received: dict[int, list[float]] = {}
        for msg in server.arrivals_fcfs():
            sender = msg.header.sender
            received.setdefault(sender, []).append(float(msg.payload.sum()))
            if sender == 4:
                received[-4] = [float(v) for v in msg.payload[8:12]]
            server.reply(sender, params)
        server.settle(2.0)
        state = server.state
        return {"lost": dict(state.lost), "stopped": sorted(state.stopped), "got": received}
    link = WorkerEndpoint(transport, params)
    link.handshake()
    if rank == 1:
        for step in range(1, EXCHANGES + 1):
            link.exchange(torch.full((N,), 1.0), MessageKind.GRADIENT, step)
        link.goodbye(PhaseTotals(), EXCHANGES)
        return {}
    _forge(rank, FORGERIES[rank])
    time.sleep(2 * SILENCE_S + 1)  # alive (connections open) until the server has given up on it
    return {}


def test_forged_messages_cost_the_server_only_their_sender() -> None:
    results = run_spawned(_fuzz, 2 + len(FORGERIES), timeout_s=30)
    server = results[0]
    assert server["stopped"] == [1]  # the healthy worker was served to its end...
    assert len(server["got"][1]) == EXCHANGES
    lost = server["lost"]
    assert sorted(lost) == sorted(FORGERIES), lost  # ...and every forger was given up, alone
    assert f"longer than {HEADER_WORDS} words" in lost[2]
    assert "has 500 elements, not 1000" in lost[3]
    # The short payload was read into a zeroed buffer: 10 values, then zeros, never old memory.
    assert server["got"][4] == [30.0] and server["got"][-4] == [3.0, 3.0, 0.0, 0.0]
    assert "did not read the server's reply" in lost[4] or "sent nothing" in lost[4]
    assert "sent nothing" in lost[5]  # its header never got a payload: only its thread waited
    assert "has 2 elements, not 5" in lost[6]
    assert "step went from 0 to 1000000" in lost[7]
