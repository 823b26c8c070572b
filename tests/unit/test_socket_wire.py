"""The socket wire's pieces without a process group (tether.comm.socket_wire, wire_setup): its set-up keeps
out what is not a worker without keeping a worker out, and its connections read exactly, time out
on their own and report a closed peer."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
import torch

from tether.comm import wire_setup
from tether.comm.socket_wire import WireClosed, WireConnection
from tether.comm.wire_setup import _accept_all, _listen, connect_to_server

TOKEN = bytes(range(16))


def _serve(listener: socket.socket, found: dict[str, Any], timeout_s: float = 10.0) -> None:
    try:
        found["connections"] = _accept_all(listener, {1: TOKEN}, 2, (0, 1), timeout_s)
    except Exception as exc:  # handed to the test
        found["error"] = exc


def test_a_flood_of_silent_connections_keeps_no_worker_out() -> None:
    listener = _listen("127.0.0.1", 2)
    host, port = listener.getsockname()[:2]
    found: dict[str, Any] = {}
    server = threading.Thread(target=_serve, args=(listener, found))
    server.start()
    flood = [socket.create_connection((host, port)) for _ in range(30)]  # room for 4 waiting
    mine = connect_to_server(host, port, 1, TOKEN, (0, 1), 5.0)
    server.join(15)
    listener.close()
    assert "error" not in found, found
    assert sorted(found["connections"]) == [(1, 0), (1, 1)] and sorted(mine) == [(0, 0), (0, 1)]
    for sock in flood:  # every one of them was closed by the server, none was taken
        sock.settimeout(5)
        assert sock.recv(1) == b""


def test_a_silent_connection_is_dropped_while_the_server_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire_setup, "INTRO_S", 0.3)
    listener = _listen("127.0.0.1", 2)
    host, port = listener.getsockname()[:2]
    found: dict[str, Any] = {}
    server = threading.Thread(target=_serve, args=(listener, found))
    server.start()
    silent = socket.create_connection((host, port))
    silent.settimeout(5)
    assert silent.recv(1) == b""  # closed after 0.3 s, with the set-up still waiting
    assert server.is_alive()
    connect_to_server(host, port, 1, TOKEN, (0, 1), 5.0)
    server.join(15)
    listener.close()
    assert sorted(found["connections"]) == [(1, 0), (1, 1)]


def test_a_worker_that_never_connects_is_named() -> None:
    listener = _listen("127.0.0.1", 2)
    found: dict[str, Any] = {}
    _serve(listener, found, timeout_s=0.5)
    listener.close()
    assert "worker rank(s) 1 did not connect" in str(found["error"])


def test_connections_read_exactly_time_out_alone_and_see_a_closed_peer() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # a TCP pair over loopback
        a = socket.create_connection(listener.getsockname()[:2])
        b, _ = listener.accept()
    here, there = WireConnection(a, 1, 0), WireConnection(b, 0, 0)
    there.write([memoryview(bytes(range(10)))], 5.0)
    first = bytearray(4)
    here.read_into(memoryview(first), 5.0)  # exactly 4 bytes of the 10
    assert bytes(first) == bytes(range(4))
    rest = bytearray(8)
    with pytest.raises(TimeoutError, match=r"rank 1 \(channel 0\) sent nothing for 0.2 s"):
        here.read_into(memoryview(rest), 0.2)  # 6 arrive, 2 never do
    # a peer that reads nothing: the write gives up after its own deadline
    payload = memoryview(torch.zeros(16 << 20, dtype=torch.uint8).numpy()).cast("B")
    with pytest.raises(TimeoutError, match="read nothing"):
        here.write([payload], 0.3)
    there.close()
    with pytest.raises(WireClosed, match="closed its connection"):
        here.read_into(memoryview(bytearray(1 << 20)), 5.0)
    here.close()


def test_a_worker_closing_after_its_goodbye_ends_the_stream_without_a_reset() -> None:
    # A worker closes its end after its goodbye, with bytes from the server it never read:
    # the server still reads the whole goodbye, then the end of the stream, not a reset (a
    # plain close with unread bytes, which is what the worker's exit did before it closed its
    # own end, resets the connection), and the worker keeps no socket.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname()[:2])
        b, _ = listener.accept()
    worker, server = WireConnection(a, 0, 1), WireConnection(b, 1, 1)
    server.write([memoryview(b"unread")], 5.0)
    goodbye = bytes(range(64))
    worker.write([memoryview(goodbye)], 5.0)
    threading.Event().wait(0.1)  # the unread bytes have arrived at the worker
    worker.close_after_sending()
    assert a.fileno() == -1
    received = bytearray(len(goodbye))
    server.read_into(memoryview(received), 5.0)
    assert bytes(received) == goodbye
    with pytest.raises(WireClosed, match="closed its connection"):
        server.read_into(memoryview(bytearray(1)), 5.0)
    server.close()
