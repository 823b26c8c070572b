"""The parameter-server wire: header-checked messages on one TCP connection per worker and channel.

Why not gloo's point-to-point. A gloo receive into a buffer shorter than the arriving message
aborts the receiving process inside gloo's I/O thread (``EnforceNotMet ... preamble.length <=
op.nbytes``), where nothing can catch it: any member of the group could end the server by
sending more than it posted. On a byte stream the receiver decides how much it reads: it reads a
header's eight words, validates them (:mod:`tether.comm.messages`), then reads exactly the payload
they announce, never more. A peer that sends more than it announced only desynchronises its own
stream (its next "header" fails the magic check and it is given up alone); one that sends less
stalls only its own connection, which the server's silence timeout gives up. A timeout on one
connection closes nothing else, unlike gloo's, which closes every connection of the process.

Setup is collective over the process group (its one use here): rank 0 listens on an ephemeral
port of ``host`` (the rendezvous address: loopback for a local run) and scatters the port and a
random token per worker; each worker opens one connection per channel and introduces itself with
(magic, rank, channel, its token). Rank 0 accepts until every worker's channels are connected,
drops any connection that does not introduce itself correctly (a wrong token, an unknown rank, a
duplicate, silence), then closes the listener: nothing listens while the run trains.

A send's bytes are written by the thread that waits for it (one message at a time per
connection): ``isend_message`` sends nothing until its ``wait()``. The server waits for its
replies on one thread per worker (:mod:`tether.methods.reply_lines`), so a worker that stops
reading stalls only its own line.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hmac
import secrets
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

import torch

from tether.comm.header import HEADER_WORDS
from tether.comm.messages import CHANNEL_STRIDE, HEADER_TAG, MessageProtocol
from tether.errors import TetherError

SERVER = 0
# Every channel a server method uses: 0 data, 1 liveness (ps_server), 2 hogwild-easgd's
# threaded exchanges, 3 the Hogwild set-up. Every worker connects all of them at set-up, so a
# worker that dies at any point closes a connection the server is reading.
CHANNELS = (0, 1, 2, 3)
_INTRO = struct.Struct("<8sqq16s")  # magic, rank, channel, token
_INTRO_MAGIC = b"TETHWIRE"
# How long a new connection may take to introduce itself (a worker does it as it connects).
INTRO_S = 10.0
ADDRESS_BYTES = 128  # token (16), port (2), host length (1), host
# A timeout this long is "wait for the peer as long as the run lasts": a plain blocking read
# (poll's millisecond timeout would overflow).
_FOREVER_S = 86400.0


class WireClosed(ConnectionError):
    """The peer closed its connection (it exited or died), or it was closed here."""


class WireSend:
    """A message to send: its bytes are written by ``wait()``, on the waiting thread (the
    server waits on each worker's reply line, :mod:`tether.methods.reply_lines`, so its serving
    thread never blocks on a slow reader). Holds the tensors until then."""

    def __init__(self, connection: _Connection, tensors: list[torch.Tensor], timeout_s: float):
        self._connection = connection
        self._tensors = tensors
        self._timeout_s = timeout_s

    def wait(self, timeout: datetime.timedelta | None = None) -> None:
        if self._tensors:
            seconds = self._timeout_s if timeout is None else timeout.total_seconds()
            self._connection.write([_bytes_of(t) for t in self._tensors], seconds)
            self._tensors = []

    def is_completed(self) -> bool:
        return not self._tensors


class _Connection:
    """One TCP connection to one peer on one channel: exact reads, whole-message writes.

    Reads and writes wait with ``poll`` and move bytes without blocking, so each has its own
    deadline although one thread may read while another writes (a socket's own timeout is one
    setting for both)."""

    def __init__(self, sock: socket.socket, peer: int, channel: int) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.peer = peer
        self.channel = channel
        self._write_lock = threading.Lock()  # one message's bytes at a time
        # (select() cannot take descriptors past 1024: poll)
        self._readable = select.poll()
        self._readable.register(sock, select.POLLIN)
        self._writable = select.poll()
        self._writable.register(sock, select.POLLOUT)

    def _describe(self) -> str:
        return f"rank {self.peer} (channel {self.channel})"

    def write(self, views: list[memoryview], timeout_s: float | None) -> None:
        """Write the views in order, as one message; ``TimeoutError`` if the peer does not take
        them within ``timeout_s``."""
        deadline = _Deadline(timeout_s)
        with self._write_lock:
            for view in views:
                self._transfer(view, self.sock.send, self._writable, deadline, "read nothing")

    def read_into(self, view: memoryview, timeout_s: float | None) -> None:
        """Fill ``view`` exactly; raise :class:`WireClosed` at end of stream, ``TimeoutError``
        when ``timeout_s`` passes first."""
        deadline = _Deadline(timeout_s)
        self._transfer(view, self.sock.recv_into, self._readable, deadline, "sent nothing")

    def _transfer(
        self,
        view: memoryview,
        move: Callable[[memoryview], int],
        ready: select.poll,
        deadline: _Deadline,
        idle: str,
    ) -> None:
        """Move all of ``view`` with ``move`` (send or receive: the bytes moved, 0 at the end of
        the stream), waiting until ``ready`` says the socket can move some."""
        done = 0
        while done < len(view):
            if not deadline.wait(ready):
                raise TimeoutError(
                    f"{self._describe()} {idle} for {deadline.timeout_s} s "
                    f"({done} of {len(view)} bytes of a message)"
                )
            try:
                moved = move(view[done:])
            except BlockingIOError:
                continue
            except OSError as exc:
                raise WireClosed(f"the connection to {self._describe()} failed: {exc}") from exc
            if moved == 0:
                raise WireClosed(f"{self._describe()} closed its connection")
            done += moved

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already closed by the peer
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread waiting on it
        self.sock.close()


class _Deadline:
    """``timeout_s`` from now (None, or longer than a day: no deadline)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        bounded = timeout_s is not None and timeout_s < _FOREVER_S
        self._at = time.monotonic() + timeout_s if bounded and timeout_s is not None else None

    def wait(self, poller: select.poll) -> bool:
        """Wait until ``poller`` reports its socket ready; False when the deadline passed."""
        while True:
            if self._at is None:
                wait_ms = 60_000  # poll again (a closed socket reports ready at once)
            else:
                left = self._at - time.monotonic()
                if left <= 0:
                    return False
                wait_ms = max(1, int(left * 1000))
            if poller.poll(wait_ms):
                return True


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor (any dtype, bfloat16 included), no copy."""
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    flat = tensor.contiguous().view(-1)
    return flat.view(torch.uint8).numpy().data.cast("B")


class SocketWire(MessageProtocol):
    """The header-checked message protocol between rank 0 (the server) and ranks 1..P, each
    message on its own (peer, channel) connection. Only explicit sources: there is no
    any-source receive (the server reads each worker on that worker's own thread)."""

    # A stream is read exactly: the header's words, then the announced payload, nothing more.
    header_capacity = HEADER_WORDS
    payload_posts_whole_buffer = False

    def __init__(
        self,
        rank: int,
        world_size: int,
        connections: dict[tuple[int, int], _Connection],
        timeout_s: float,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self._connections = connections
        # What a send or receive waits when its caller names no timeout (gloo's group timeout
        # played this part): a hung server then fails its workers instead of holding them.
        self.timeout_s = timeout_s

    def close(self) -> None:
        """Close every connection: a peer still reading sees the end of its stream."""
        for connection in self._connections.values():
            connection.close()

    def _connection(self, peer: int, tag: int) -> _Connection:
        channel = (tag - HEADER_TAG) // CHANNEL_STRIDE
        connection = self._connections.get((peer, channel))
        if connection is None:
            raise TetherError(
                f"rank {self.rank} has no connection to rank {peer} (channel {channel})"
            )
        return connection

    def _send_parts(self, parts: list[tuple[torch.Tensor, int]], dst: int) -> WireSend:
        connection = self._connection(dst, parts[0][1])
        return WireSend(connection, [t.detach().cpu() for t, _ in parts], self.timeout_s)

    def _recv(
        self,
        tensor: torch.Tensor,
        src: int | None,
        tag: int,
        timeout: datetime.timedelta | None,
        what: str = "header",
    ) -> int:
        if src is None:
            raise TetherError("the socket wire has no any-source receive: name the sender")
        connection = self._connection(src, tag)
        seconds = self.timeout_s if timeout is None else timeout.total_seconds()
        if tensor.numel() == 0:
            return src
        if tensor.is_cpu and tensor.is_contiguous():
            connection.read_into(_bytes_of(tensor), seconds)
        else:  # a device buffer: through host memory
            staging = torch.empty(tensor.shape, dtype=tensor.dtype)
            connection.read_into(_bytes_of(staging), seconds)
            tensor.copy_(staging)
        return src


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
) -> dict[tuple[int, int], _Connection]:
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
        connections[SERVER, channel] = _Connection(sock, SERVER, channel)
    return connections


def _accept_all(
    listener: socket.socket,
    tokens: dict[int, bytes],
    world_size: int,
    channels: Sequence[int],
    timeout_s: float,
) -> dict[tuple[int, int], _Connection]:
    """Accept until every (worker, channel) is connected. One thread, non-blocking: a connection
    that lies (a wrong token, an unknown or taken slot) is dropped at once, one that stays silent
    after ``INTRO_S``, and when too many wait at once the oldest goes: none holds up a worker."""
    expected = {(r, c) for r in range(1, world_size) for c in channels}
    connections: dict[tuple[int, int], _Connection] = {}
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
                connections[peer, channel] = _Connection(sock, peer, channel)
    except BaseException:
        for connection in connections.values():
            connection.close()
        raise
    finally:
        for sock in list(pending):
            sock.close()
        selector.close()
    return connections
