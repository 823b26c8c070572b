"""Forged messages against the real parameter server (ServerEndpoint, first come first served,
on the socket wire the server methods use): a broken or hostile worker is given up alone, the
server process survives, and a healthy worker is served to its end.

Rank 0 serves, rank 1 is a healthy worker doing 20 exchanges (before its own connections it
tries the set-up with a wrong token, with garbage, with a silent connection and with its own
token for rank 2's place, and after the set-up it finds nothing listening), ranks 2.. each forge one message after a proper handshake.
Four of the forgeries (a long header, a 64 MB message in place of a header, a payload longer
than its header, a payload of another dtype's byte count) aborted the server process on gloo's
point-to-point; on the wire the server reads only what a header announced."""

from __future__ import annotations

import socket
import threading
import time

import torch
import torch.distributed as dist

from tether.comm.header import MessageHeader, MessageKind
from tether.comm.socket_wire import SocketWire
from tether.comm.wire_setup import (
    ADDRESS_BYTES,
    CHANNELS,
    connect_to_server,
    open_socket_wire,
    parse_address,
)
from tether.launch.env import DistEnv, server_wire_address
from tether.launch.spawn import run_spawned
from tether.methods.ps_server import DATA_CHANNEL, ServerEndpoint
from tether.methods.ps_worker import WorkerEndpoint
from tether.observe.metrics import PhaseTotals

N = 1000  # parameters
EXCHANGES = 20
SILENCE_S = 3.0
SETUP_S = 20.0
# Rank -> what it forges (after its handshake).
FORGERIES = {
    2: "long header",  # 1000 words, the first 8 a valid header of a 1000-element gradient
    3: "64 MB header",  # 64 MB of 7s where a header belongs
    4: "payload longer than its header",  # header: 500 elements; payload: 1000
    5: "payload of another dtype",  # header: 1000 float32; payload: 1000 float64
    6: "payload shorter than its header",  # header: 1000 elements; payload: 10, then silence
    7: "short goodbye",  # a STOP whose totals have 2 words instead of 5
    8: "step jump",  # step 10**6 after step 0
}


def _send_raw(wire: SocketWire, *parts: torch.Tensor) -> None:
    """Write ``parts`` on the data connection as they are, in a thread: a server that gave up
    reading this worker leaves a long write blocked, which must not keep this process alive."""
    connection = wire._connections[0, DATA_CHANNEL]
    raw = b"".join(part.contiguous().view(torch.uint8).numpy().tobytes() for part in parts)
    threading.Thread(target=connection.sock.sendall, args=(raw,), daemon=True).start()


def _forge(wire: SocketWire, rank: int, kind: str) -> None:
    def header(length: int, dtype: torch.dtype = torch.float32, step: int = 1) -> torch.Tensor:
        return MessageHeader(MessageKind.GRADIENT, rank, step, length, dtype).encode()

    if kind == "long header":
        padded = torch.full((1000,), 7, dtype=torch.int64)
        padded[:8] = header(N)
        _send_raw(wire, padded)
    elif kind == "64 MB header":
        _send_raw(wire, torch.full((8 << 20,), 7, dtype=torch.int64))
    elif kind == "payload longer than its header":
        _send_raw(wire, header(500), torch.ones(N))
    elif kind == "payload of another dtype":
        _send_raw(wire, header(N), torch.ones(N, dtype=torch.float64))
    elif kind == "payload shorter than its header":
        _send_raw(wire, header(N), torch.full((10,), 3.0))
    elif kind == "short goodbye":
        stop = MessageHeader(MessageKind.STOP, rank, 1, 2, torch.float64).encode()
        _send_raw(wire, stop, torch.ones(2, dtype=torch.float64))
    elif kind == "step jump":
        _send_raw(wire, header(N, step=10**6), torch.ones(N))


def _intrude(host: str, port: int, token: bytes) -> list[socket.socket]:
    """Connections that must not take a worker's place: a wrong token, garbage, silence, and
    this worker's own (valid) token offered for another worker's slot."""

    def intro(rank: int, offered: bytes) -> bytes:
        return b"TETHWIRE" + rank.to_bytes(8, "little") + bytes(8) + offered

    wrong = socket.create_connection((host, port))
    wrong.sendall(intro(1, bytes(16)))
    garbage = socket.create_connection((host, port))
    garbage.sendall(bytes(range(40)))
    silent = socket.create_connection((host, port))
    impostor = socket.create_connection((host, port))
    impostor.sendall(intro(2, token))  # rank 1's token, rank 2's slot
    return [wrong, garbage, silent, impostor]


def _fuzz(rank: int, world: int) -> dict:
    params = torch.zeros(N)

    def scatter(tensor: torch.Tensor, parts: list[torch.Tensor] | None) -> None:
        dist.scatter(tensor, parts, src=0)

    if rank == 0:
        wire = open_socket_wire(scatter, 0, world, SETUP_S, server_wire_address(DistEnv.read()))
        server = ServerEndpoint(wire, params, silence_timeout_s=SILENCE_S, max_step_jump=1)
        server.handshake(params)
        received: dict[int, list[float]] = {}
        for msg in server.arrivals_fcfs():
            sender = msg.header.sender
            received.setdefault(sender, []).append(float(msg.payload.sum()))
            server.reply(sender, params)
        server.settle(2.0)
        state = server.state
        return {"lost": dict(state.lost), "stopped": sorted(state.stopped), "got": received}
    address = torch.zeros(ADDRESS_BYTES, dtype=torch.uint8)
    scatter(address, None)
    host, port, token = parse_address(address)
    intruders = _intrude(host, port, token) if rank == 1 else []
    connections = connect_to_server(host, port, rank, token, CHANNELS, SETUP_S)
    wire = SocketWire(rank, world, connections, SETUP_S)
    link = WorkerEndpoint(wire, params)
    link.handshake()
    if rank == 1:
        try:
            socket.create_connection((host, port), timeout=5).close()
            listening_after_setup = True
        except OSError:
            listening_after_setup = False
        for step in range(1, EXCHANGES + 1):
            link.exchange(torch.full((N,), 1.0), MessageKind.GRADIENT, step)
        link.goodbye(PhaseTotals(), EXCHANGES)
        dropped = [s.recv(1) == b"" for s in intruders]  # the server closed them
        return {
            "host": host,
            "listening_after_setup": listening_after_setup,
            "intruders_dropped": dropped,
        }
    _forge(wire, rank, FORGERIES[rank])
    time.sleep(2 * SILENCE_S + 1)  # alive (connections open) until the server has given up on it
    return {}


def test_forged_messages_cost_the_server_only_their_sender() -> None:
    results = run_spawned(_fuzz, 2 + len(FORGERIES), timeout_s=40)
    server = results[0]
    # The server listened on loopback (the rendezvous address of a local group), only until its
    # workers had connected, and dropped every connection that was not one of them.
    assert results[1] == {
        "host": "127.0.0.1",
        "listening_after_setup": False,
        "intruders_dropped": [True] * 4,
    }
    assert server["stopped"] == [1]  # the healthy worker was served to its end...
    assert server["got"][1] == [float(N)] * EXCHANGES
    lost = server["lost"]
    assert sorted(lost) == sorted(FORGERIES), lost  # ...and every forger was given up, alone
    # The long header's first 8 words were a header, the next 1000 floats its payload (garbage
    # a peer may send anyway); the rest is no header.
    assert len(server["got"][2]) == 1 and "bad magic" in lost[2]
    assert 3 not in server["got"] and "bad magic" in lost[3]
    assert "has 500 elements, not 1000" in lost[4]
    # Read as the 1000 float32 its header announced (4000 of the 8000 bytes), then no header.
    assert len(server["got"][5]) == 1 and "bad magic" in lost[5]
    assert 6 not in server["got"] and "sent nothing" in lost[6]  # its payload never completed
    assert "has 2 elements, not 5" in lost[7]
    assert "step went from 0 to 1000000" in lost[8]
