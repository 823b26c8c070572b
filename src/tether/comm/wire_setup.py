"""Making the parameter-server wire's connections (:mod:`tether.comm.socket_wire`).

Setup is collective over the process group (its one use here): rank 0 listens on an ephemeral
port of ``host`` (the rendezvous address: loopback for a local run) and scatters the port and a
random token per worker; each worker opens one connection per channel and introduces itself with
(magic, rank, channel, its token). Rank 0 accepts until every worker's channels are connected,
drops any connection that does not introduce itself correctly (a wrong token, an unknown rank, a
duplicate, silence), then closes the listener: nothing listens while the run trains.
"""

from __future__ import annotations

import errno
import hmac
import secrets
import selectors
import socket
import struct
import time
from collections.abc import Callable, Sequence

import torch

from tether.comm.socket_wire import SERVER, SocketWire, WireConnection
from tether.errors import TetherError

# Every channel a server method uses: 0 data, 1 liveness (ps_server), 2 hogwild-easgd's
# threaded exchanges, 3 the Hogwild set-up. Every worker connects all of them at set-up, so a
# worker that dies at any point closes a connection the server is reading.
CHANNELS = (0, 1, 2, 3)
_INTRO = struct.Struct("<8sqq16s")  # magic, rank, channel, token
_INTRO_MAGIC = b"TETHWIRE"
# How long a new connection may take to introduce itself (a worker does it as it connects).
INTRO_S = 10.0
ADDRESS_BYTES = 128  # token (16), port (2), host length (1), host


def open_socket_wire(
    scatter: Callable[[torch.Tensor, list[torch.Tensor] | None], object],
    rank: int,
    world_size: int,
    timeout_s: float,
    host: str,
    channels: Sequence[int] = CHANNELS,
) -> SocketWire:
    """Connect rank 0 to every other rank, once per channel. Collective: every rank of the group
    calls it; ``scatter(tensor, parts)`` is the group's scatter from rank 0 (``parts`` on rank 0,
    None elsewhere), used once: each worker gets the address (rank 0 listens on ``host``) and a
    token of its own, so that no worker can introduce itself as another."""
    address = torch.zeros(ADDRESS_BYTES, dtype=torch.uint8)
    listener = None
    tokens: dict[int, bytes] = {}
    parts = None
    if rank == SERVER:
        listener = _listen(host, world_size)
        name = listener.getsockname()[0].encode()
        port = listener.getsockname()[1]
        tokens = {r: secrets.token_bytes(16) for r in range(1, world_size)}
        parts = [torch.zeros(ADDRESS_BYTES, dtype=torch.uint8) for _ in range(world_size)]
        for r, token in tokens.items():
            packed = token + struct.pack(">HB", port, len(name)) + name
            parts[r][: len(packed)] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
    scatter(address, parts)
    if rank != SERVER:
        server_host, port, token = parse_address(address)
        connections = connect_to_server(server_host, port, rank, token, channels, timeout_s)
        return SocketWire(rank, world_size, connections, timeout_s)
    assert listener is not None
    try:
        connections = _accept_all(listener, tokens, world_size, channels, timeout_s)
    finally:
        listener.close()
    return SocketWire(rank, world_size, connections, timeout_s)


def parse_address(address: torch.Tensor) -> tuple[str, int, bytes]:
    """(host, port, this worker's token) from the set-up's scatter."""
    raw = bytes(address.tolist())
    port, length = struct.unpack(">HB", raw[16:19])
    return raw[19 : 19 + length].decode(), port, raw[:16]


def _listen(host: str, world_size: int) -> socket.socket:
    backlog = max(16, 4 * world_size)
    family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]  # IPv4 or IPv6
    try:
        return socket.create_server((host, 0), family=family, backlog=backlog)
    except OSError as exc:
        if exc.errno != errno.EADDRNOTAVAIL:
            raise
    # The rendezvous address is another machine's: listen on the address this machine reaches
    # it from (a UDP "connect" only picks the route; nothing is sent).
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        local = probe.getsockname()[0]
    return socket.create_server((local, 0), family=family, backlog=backlog)


def connect_to_server(
    host: str, port: int, rank: int, token: bytes, channels: Sequence[int], timeout_s: float
) -> dict[tuple[int, int], WireConnection]:
    """A worker's connections to the server, one per channel, each introduced with the token."""
    connections = {}
    for channel in channels:
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
            sock.sendall(_INTRO.pack(_INTRO_MAGIC, rank, channel, token))
        except OSError as exc:
            raise TetherError(
                f"rank {rank} could not connect to the server at {host}:{port}: {exc}"
            ) from exc
        connections[SERVER, channel] = WireConnection(sock, SERVER, channel)
    return connections


def _accept_all(
    listener: socket.socket,
    tokens: dict[int, bytes],
    world_size: int,
    channels: Sequence[int],
    timeout_s: float,
) -> dict[tuple[int, int], WireConnection]:
    """Accept until every (worker, channel) is connected. One thread, non-blocking: a connection
    that lies (a wrong token, an unknown or taken slot) is dropped at once, one that stays silent
    after ``INTRO_S``, and when too many wait at once the oldest goes: none holds up a worker."""
    expected = {(r, c) for r in range(1, world_size) for c in channels}
    connections: dict[tuple[int, int], WireConnection] = {}
    pending: dict[socket.socket, tuple[bytearray, float]] = {}  # intro so far, its deadline
    selector = selectors.DefaultSelector()
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ)

    def drop(sock: socket.socket) -> None:
        selector.unregister(sock)
        pending.pop(sock, None)
        sock.close()

    deadline = time.monotonic() + timeout_s
    try:
        while len(connections) < len(expected):
            now = time.monotonic()
            for late in [s for s, (_, due) in pending.items() if due <= now]:
                drop(late)  # silent for too long
            left = deadline - now
            if left <= 0:
                missing = sorted({r for r, c in expected if (r, c) not in connections})
                raise TetherError(
                    f"worker rank(s) {', '.join(map(str, missing))} did not connect to the "
                    f"parameter server within {timeout_s:.0f} s"
                )
            wake = min([left] + [due - now for _, due in pending.values()])
            for key, _ in selector.select(timeout=max(wake, 0.0)):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is listener:
                    if len(pending) >= 2 * len(expected):  # a flood: the oldest waiter goes
                        drop(min(pending, key=lambda s: pending[s][1]))
                    try:
                        accepted, _ = listener.accept()
                    except OSError:  # gone before we took it, or out of descriptors for now
                        continue
                    accepted.setblocking(False)
                    pending[accepted] = (bytearray(), time.monotonic() + min(INTRO_S, timeout_s))
                    selector.register(accepted, selectors.EVENT_READ)
                    continue
                if sock not in pending:
                    continue  # dropped above in this round
                buffer = pending[sock][0]
                try:
                    chunk = sock.recv(_INTRO.size - len(buffer))
                except OSError:
                    chunk = b""
                if not chunk:
                    drop(sock)
                    continue
                buffer += chunk
                if len(buffer) < _INTRO.size:
                    continue
                magic, peer, channel, offered = _INTRO.unpack(bytes(buffer))
                known = (peer, channel) in expected and (peer, channel) not in connections
                genuine = known and hmac.compare_digest(offered, tokens[peer])
                if magic != _INTRO_MAGIC or not genuine:
                    drop(sock)
                    continue
                selector.unregister(sock)
                del pending[sock]
                connections[peer, channel] = WireConnection(sock, peer, channel)
    except BaseException:
        for connection in connections.values():
            connection.close()
        raise
    finally:
        for sock in list(pending):
            sock.close()
        selector.close()
    return connections
