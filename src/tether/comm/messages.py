"""The header-checked message protocol, shared by every transport.

A message is a fixed header (:mod:`tether.comm.header`: magic, kind, sender, step, length, dtype,
and a worker's loss report) then a payload. Headers and payloads travel on different tags, so that a receive-from-any-source
for a header can never match another sender's payload; the header is validated against the
receive buffer BEFORE the payload is received (a gloo receive into a buffer smaller than the
message aborts the process; MPI calls it a truncation error), and the payload is then received
from the header's sender only. Both torch.distributed and MPI keep one sender's messages on one
tag in order (MPI-3.1 section 3.5, non-overtaking), so a sender's payload follows its header.

A transport provides two primitives, ``_send_parts`` (post tensors on tags to one rank) and
``_recv`` (receive one tensor, from a rank or from any, with an optional timeout); this class
builds the protocol on them.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tether.comm.header import HEADER_WORDS, MessageHeader, MessageKind, ProtocolError

HEADER_TAG = 7001
PAYLOAD_TAG = 7002
# Independent message streams between the same two ranks (e.g. data and a liveness watch) use
# different channels: channel k shifts both tags by 10*k, so streams never match each other.
CHANNEL_STRIDE = 10


def message_tags(channel: int) -> tuple[int, int]:
    """(header tag, payload tag) of ``channel``."""
    return HEADER_TAG + CHANNEL_STRIDE * channel, PAYLOAD_TAG + CHANNEL_STRIDE * channel


@dataclass(frozen=True)
class Message:
    header: MessageHeader
    payload: torch.Tensor  # a view of the receive buffer, ``header.length`` elements long


class MessageProtocol:
    """``isend_message`` / ``send_message`` / ``recv_message`` on a transport's primitives."""

    rank: int
    world_size: int
    # Words a header receive posts. A transport whose receive aborts the process on a message
    # longer than the buffer (gloo) posts more than a header needs, zeroed, and refuses a header
    # with anything beyond its words; one that reports it (MPI: truncation) posts exactly.
    header_capacity: int = HEADER_WORDS
    # Whether the payload receive posts the whole buffer (the most it accepts) rather than the
    # header's length: the same protection against a payload longer than its header.
    payload_posts_whole_buffer: bool = False

    def close(self) -> None:
        """Release the transport's connections (a transport that owns none does nothing)."""

    def has_data(self, src: int, channel: int = 0) -> bool:
        """Whether ``src`` has begun a message on ``channel`` that a receive would take at once
        (False where a transport cannot tell: nothing is read ahead there)."""
        del src, channel
        return False

    def _send_parts(self, parts: list[tuple[torch.Tensor, int]], dst: int) -> Any:
        """Post each (tensor, tag) to ``dst`` without blocking; returns a handle with ``wait()``
        that holds the tensors until the sends complete."""
        raise NotImplementedError

    def _recv(
        self,
        tensor: torch.Tensor,
        src: int | None,
        tag: int,
        timeout: datetime.timedelta | None,
        what: str = "header",
    ) -> int:
        """Receive into ``tensor`` from ``src`` (None: any rank); returns the sender's rank."""
        raise NotImplementedError

    def isend_message(
        self,
        payload: torch.Tensor,
        dst: int,
        kind: MessageKind,
        step: int = 0,
        channel: int = 0,
        loss: tuple[float, int] = (0.0, 0),
    ) -> Any:
        """Send header then payload without blocking; keep the result and ``wait()`` on it.
        ``loss``: (mean loss, over how many steps), for the header's loss report; a server's
        reply: (busy seconds so far, 0) (see :class:`~tether.comm.header.MessageHeader`)."""
        payload = payload.detach().contiguous().view(-1)
        n = payload.numel()
        header = MessageHeader(kind, self.rank, step, n, payload.dtype, *loss).encode()
        header_tag, payload_tag = message_tags(channel)
        parts = [(header, header_tag)] + ([(payload, payload_tag)] if payload.numel() else [])
        return self._send_parts(parts, dst)

    def send_message(
        self,
        payload: torch.Tensor,
        dst: int,
        kind: MessageKind,
        step: int = 0,
        channel: int = 0,
        loss: tuple[float, int] = (0.0, 0),
    ) -> None:
        self.isend_message(payload, dst, kind, step, channel, loss).wait()

    def recv_message(
        self,
        buffer: torch.Tensor | Mapping[MessageKind, torch.Tensor],
        src: int | None = None,
        kinds: frozenset[MessageKind] | None = None,
        channel: int = 0,
        timeout: datetime.timedelta | None = None,
    ) -> Message:
        """Receive one message from ``src``, or from whichever rank sends first when ``src`` is
        None. ``buffer`` is a flat receive buffer, or a buffer per accepted message kind (the
        kinds it maps are then the accepted ones). The header is validated against the buffer
        before the payload is received; a bad header raises
        :class:`~tether.comm.header.ProtocolError`.

        ``timeout`` bounds each of the two receives (see the transport for what a timeout does
        to its connections)."""
        header_tag, payload_tag = message_tags(channel)
        posted = torch.zeros(self.header_capacity, dtype=torch.int64)
        sender = self._recv(posted, src, header_tag, timeout)
        words = posted[:HEADER_WORDS]
        if bool(posted[HEADER_WORDS:].any()):
            raise ProtocolError(f"header from rank {sender} is longer than {HEADER_WORDS} words")
        if isinstance(buffer, Mapping):
            kinds = frozenset(buffer)
            announced = MessageHeader.peek_kind(words, sender, kinds)
            buffer = buffer[announced]
        assert buffer.is_contiguous() and buffer.dim() == 1, "receive buffers are flat"
        header = MessageHeader.decode(words, sender, buffer.numel(), buffer.dtype, kinds)
        payload = buffer[: header.length]
        if header.length:
            # (NCCL, for CUDA payloads, needs equal counts on both sides: post exactly there.)
            whole = self.payload_posts_whole_buffer and buffer.device.type == "cpu"
            target = buffer if whole else payload
            self._recv(target, sender, payload_tag, timeout, what="payload")
        return Message(header, payload)
