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

The connections are made by :mod:`tether.comm.wire_setup`.

A send's bytes are written by the thread that waits for it (one message at a time per
connection): ``isend_message`` sends nothing until its ``wait()``. The server waits for its
replies on one thread per worker (:mod:`tether.methods.reply_lines`), so a worker that stops
reading stalls only its own line.
"""

from __future__ import annotations

import contextlib
import datetime
import select
import socket
import threading
import time
from collections.abc import Callable

import torch

from tether.comm.header import HEADER_WORDS
from tether.comm.messages import CHANNEL_STRIDE, HEADER_TAG, MessageProtocol
from tether.errors import TetherError

SERVER = 0
# A timeout this long is "wait for the peer as long as the run lasts": a plain blocking read
# (poll's millisecond timeout would overflow).
_FOREVER_S = 86400.0


class WireClosed(ConnectionError):
    """The peer closed its connection (it exited or died), or it was closed here."""


class WireSend:
    """A message to send: its bytes are written by ``wait()``, on the waiting thread (the
    server waits on each worker's reply line, :mod:`tether.methods.reply_lines`, so its serving
    thread never blocks on a slow reader). Holds the tensors until then."""

    def __init__(self, connection: WireConnection, tensors: list[torch.Tensor], timeout_s: float):
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


class WireConnection:
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

    def has_data(self) -> bool:
        """Whether a read would find bytes (or the end of the stream) at once."""
        return bool(self._readable.poll(0))

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

    def close_after_sending(self) -> None:
        """This end has said all it will: the peer reads every byte already written, then the
        end of the stream. What the peer sent that nobody read is dropped first: closing a
        socket with unread bytes resets the connection instead of ending it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
            while self.sock.recv(1 << 16):
                pass
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
        connections: dict[tuple[int, int], WireConnection],
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

    def close_after_sending(self) -> None:
        """A worker's end after its goodbye: each connection ends after the bytes already
        written (see :meth:`WireConnection.close_after_sending`), so nothing of the run is left
        open in a process that goes on (a user's loop that calls ``tether.init`` again)."""
        for connection in self._connections.values():
            connection.close_after_sending()

    def _connection(self, peer: int, tag: int) -> WireConnection:
        channel = (tag - HEADER_TAG) // CHANNEL_STRIDE
        connection = self._connections.get((peer, channel))
        if connection is None:
            raise TetherError(
                f"rank {self.rank} has no connection to rank {peer} (channel {channel})"
            )
        return connection

    def has_data(self, src: int, channel: int = 0) -> bool:
        connection = self._connections.get((src, channel))
        return connection is not None and connection.has_data()

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
