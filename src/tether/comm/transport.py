"""The torch.distributed transport: the backend's collectives plus header-checked point-to-point.

One object per process wraps one process group (gloo on CPU, NCCL on GPU). Methods and collective
algorithms talk to this interface, never to ``torch.distributed`` directly, so a second transport
(MPI) can stand in later with the same calls.

Point-to-point messages are a header (see :mod:`tether.comm.header`) then a payload. Headers and
payloads travel on different tags so that a receive-from-any-source for a header can never match
another sender's payload.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

from tether.comm.header import HEADER_WORDS, MessageHeader, MessageKind

HEADER_TAG = 7001
PAYLOAD_TAG = 7002
# Independent message streams between the same two ranks (e.g. data and a liveness watch) use
# different channels: channel k shifts both tags by 10*k, so streams never match each other.
CHANNEL_STRIDE = 10


def _tags(channel: int) -> tuple[int, int]:
    return HEADER_TAG + CHANNEL_STRIDE * channel, PAYLOAD_TAG + CHANNEL_STRIDE * channel


_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


@dataclass(frozen=True)
class Message:
    header: MessageHeader
    payload: torch.Tensor  # a view of the receive buffer, ``header.length`` elements long


@dataclass
class PendingSend:
    """An in-flight send. The tensors are held here so that they outlive the transfer: dropping
    an ``isend`` buffer before completion is undefined behaviour in gloo."""

    handles: list[dist.Work]
    tensors: list[torch.Tensor] = field(default_factory=list)

    def wait(self) -> None:
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
        self.tensors.clear()

    def is_completed(self) -> bool:
        return all(h.is_completed() for h in self.handles)


class Transport(Protocol):
    """What methods and collective algorithms need from a transport (torch.distributed or MPI).

    Ranks are ranks within the transport's group. Collectives are in place and called by every
    rank in the same order; ``exchange`` posts one round's point-to-point transfers together and
    waits for all of them, which is what the schedule runner of
    :mod:`tether.comm.collectives.base` is built on."""

    rank: int
    world_size: int

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False) -> Any: ...

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Any: ...

    def reduce(self, tensor: torch.Tensor, dst: int, op: str = "sum") -> None: ...

    def barrier(self) -> None: ...

    def exchange(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
        tag: int,
    ) -> None: ...


class TorchTransport:
    """torch.distributed collectives and the header-checked point-to-point protocol."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def _group(self) -> dist.ProcessGroup:
        return self.group if self.group is not None else dist.group.WORLD  # type: ignore[return-value]

    # -- collectives ---------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False):
        """In-place all-reduce; with ``async_op`` returns a handle to ``wait()`` on."""
        return dist.all_reduce(tensor, op=_REDUCE_OPS[op], group=self.group, async_op=async_op)

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False):
        return dist.broadcast(tensor, group=self.group, group_src=src, async_op=async_op)

    def reduce(self, tensor: torch.Tensor, dst: int, op: str = "sum") -> None:
        dist.reduce(tensor, op=_REDUCE_OPS[op], group=self.group, group_dst=dst)

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def exchange(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
        tag: int,
    ) -> None:
        """Post ``sends`` (tensor, destination) and ``recvs`` (buffer, source) together, then
        wait for all. ``batch_isend_irecv`` is one isend/irecv per entry on gloo and a grouped
        launch on NCCL. Every handle is waited on while ``ops`` still holds the buffers."""
        ops = [dist.P2POp(dist.isend, t, group=self.group, tag=tag, group_peer=p) for t, p in sends]
        ops += [
            dist.P2POp(dist.irecv, t, group=self.group, tag=tag, group_peer=p) for t, p in recvs
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    # -- point to point ------------------------------------------------------------------------
    def isend_message(
        self, payload: torch.Tensor, dst: int, kind: MessageKind, step: int = 0, channel: int = 0
    ) -> PendingSend:
        """Send header then payload without blocking; keep the result and ``wait()`` on it."""
        payload = payload.contiguous().view(-1)
        header = MessageHeader(kind, self.rank, step, payload.numel(), payload.dtype).encode()
        header_tag, payload_tag = _tags(channel)
        sends = [(header, header_tag)] + ([(payload, payload_tag)] if payload.numel() else [])
        handles = []
        for tensor, tag in sends:
            handle = dist.isend(tensor, group=self.group, group_dst=dst, tag=tag)
            assert handle is not None, "this rank is a member of the group"
            handles.append(handle)
        return PendingSend(handles, [header, payload])

    def send_message(
        self, payload: torch.Tensor, dst: int, kind: MessageKind, step: int = 0, channel: int = 0
    ) -> None:
        self.isend_message(payload, dst, kind, step, channel).wait()

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

        ``timeout`` replaces the group's timeout for this receive. A gloo receive that times out
        closes every connection of the process, so a receive that may rightly wait for a whole
        run (a liveness watch, a background listener) passes a long one."""
        header_tag, payload_tag = _tags(channel)
        words = torch.empty(HEADER_WORDS, dtype=torch.int64)
        sender = self._recv(words, src, header_tag, timeout)
        if isinstance(buffer, Mapping):
            kinds = frozenset(buffer)
            announced = MessageHeader.peek_kind(words, sender, kinds)
            buffer = buffer[announced]
        assert buffer.is_contiguous() and buffer.dim() == 1, "receive buffers are flat"
        header = MessageHeader.decode(words, sender, buffer.numel(), buffer.dtype, kinds)
        payload = buffer[: header.length]
        if header.length:
            self._recv(payload, sender, payload_tag, timeout)
        return Message(header, payload)

    def _recv(
        self, tensor: torch.Tensor, src: int | None, tag: int, timeout: datetime.timedelta | None
    ) -> int:
        """Receive into ``tensor``; returns the sender's rank within ``self.group``."""
        if timeout is None:
            # torch returns a global rank.
            global_sender = dist.recv(tensor, group=self.group, group_src=src, tag=tag)
            return src if src is not None else dist.get_group_rank(self._group(), global_sender)
        work = dist.irecv(tensor, group=self.group, group_src=src, tag=tag)
        assert work is not None, "this rank is a member of the group"
        work.wait(timeout)
        return src if src is not None else work._source_rank()  # a rank within the group
