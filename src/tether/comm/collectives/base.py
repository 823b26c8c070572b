"""Run a :class:`Schedule` over a transport's point-to-point calls, and the uniform interface.

Every algorithm of this package is a :class:`Collective`: it builds schedules, and this module
runs them with the transport's point-to-point ``exchange`` of tensor chunks (one round's sends
and receives posted together, then all waited on, so two ranks exchanging in one round cannot
deadlock; on torch this is ``dist.batch_isend_irecv``, on MPI ``Isend``/``Irecv``). Sizes come
from the schedule, known to both sides, so no header travels; a reduced chunk is received into a
buffer of exactly its size.

Collectives use tags ``COLLECTIVE_TAG + round % TAG_SPAN``, apart from the parameter-server
protocol's 7001/7002 (+10 per channel), so the two never match each other's messages; distinct
tags for consecutive rounds keep a rank that runs ahead from matching an earlier round. As in MPI,
every rank of a group calls the same collectives in the same order, one at a time. On NCCL,
whose first batched point-to-point call on a group must involve every rank, make one ordinary
collective call (a barrier) on the group before the first schedule runs.
"""

from __future__ import annotations

import threading
from typing import ClassVar

import torch
import torch.distributed as dist

from tether.comm.collectives.schedule import Schedule, chunk_bounds
from tether.comm.transport import TorchTransport, Transport
from tether.errors import TetherError

# What a collective runs on: a transport (torch or MPI), or a torch process group (None: WORLD),
# which is wrapped in a TorchTransport.
Comm = Transport | dist.ProcessGroup | None


def as_transport(comm: Comm) -> Transport:
    if comm is None or isinstance(comm, dist.ProcessGroup):
        return TorchTransport(comm)
    return comm


COLLECTIVE_TAG = 8000
PIECE_BYTES = 4 << 20  # reduced chunks larger than two of these travel in pieces
TAG_SPAN = 1000
KINDS = ("all_reduce", "broadcast", "reduce")
OPS = ("sum", "avg", "max", "min")


def check_op(op: str, dtype: torch.dtype) -> None:
    """Refuse an unknown op, or ``avg`` of an integer tensor, before anything is sent."""
    if op not in OPS:
        raise TetherError(f"unknown reduce op {op!r}; valid ops: {', '.join(OPS)}")
    if op == "avg" and not (dtype.is_floating_point or dtype.is_complex):
        raise TetherError(f"op 'avg' needs a floating-point tensor, got {dtype}; use 'sum'")


def combine(target: torch.Tensor, incoming: torch.Tensor, op: str) -> None:
    """``target <- op(target, incoming)`` in place (``avg`` sums; the caller divides)."""
    if op in ("sum", "avg"):
        target.add_(incoming)
    elif op == "max":
        torch.maximum(target, incoming, out=target)
    else:
        torch.minimum(target, incoming, out=target)


_scratch = threading.local()


def scratch(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A receive buffer of ``numel`` elements of ``like``'s dtype and device, reused across
    rounds and calls (per thread): a fresh multi-MiB ``empty`` every round costs page faults
    comparable to the copy itself. Valid until the next call on this thread."""
    buffers: dict[tuple[torch.dtype, torch.device], torch.Tensor] = _scratch.__dict__.setdefault(
        "buffers", {}
    )
    key = (like.dtype, like.device)
    buf = buffers.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=like.dtype, device=like.device)
        buffers[key] = buf
    return buf[:numel]


def run_schedule(schedule: Schedule, flat: torch.Tensor, op: str, comm: Comm) -> None:
    """Execute this rank's part of ``schedule`` on the contiguous 1-D tensor ``flat``."""
    transport = as_transport(comm)
    assert flat.dim() == 1 and flat.is_contiguous(), "collectives run on flat contiguous tensors"
    rank = transport.rank
    assert schedule.world_size == transport.world_size, "schedule built for another group"
    bounds = chunk_bounds(flat.numel(), schedule.chunks)
    for r, steps in enumerate(schedule.by_round):
        sends: list[tuple[torch.Tensor, int]] = []
        recvs: list[tuple[torch.Tensor, int]] = []
        reduced: list[tuple[torch.Tensor, int]] = []  # (own chunk, source) to reduce into
        for s in steps:
            if rank not in (s.src, s.dst):
                continue
            view = flat[bounds[s.indices[0]][0] : bounds[s.indices[-1]][1]]
            if view.numel() == 0:  # both sides see the same empty chunk: nothing to move
                continue
            if s.src == rank:
                # a large reduced chunk travels in pieces (both sides split it alike)
                pieces = _pieces(view) if s.op == "reduce" else [view]
                sends += [(piece, s.dst) for piece in pieces]
            elif s.op == "copy":
                recvs.append((view, s.src))
            else:
                reduced.append((view, s.src))
        # A rank receives at most one message per round (Schedule.validate), but carve the
        # scratch buffer per reduction anyway so the runner does not depend on it.
        buf = scratch(sum(v.numel() for v, _ in reduced), flat) if reduced else flat[:0]
        reductions: list[tuple[torch.Tensor, torch.Tensor]] = []
        pieces_in: list[tuple[torch.Tensor, int]] = []  # first, so handle k is reduction k's
        offset = 0
        for view, src in reduced:
            incoming = buf[offset : offset + view.numel()]
            offset += view.numel()
            for own, piece in zip(_pieces(view), _pieces(incoming), strict=True):
                reductions.append((own, piece))
                pieces_in.append((piece, src))
        recvs = pieces_in + recvs
        if not sends and not recvs:
            continue
        tag = COLLECTIVE_TAG + r % TAG_SPAN
        if len(reductions) < 2 or _sends_overlap(sends, reductions):
            # Sends read the start-of-round value: a chunk this rank also sends this round
            # (recursive doubling) is reduced into only after every transfer has completed.
            transport.exchange(sends, recvs, tag)
            for own, piece in reductions:
                combine(own, piece, op)
            continue
        # Pipelined: add piece k while pieces k+1... are still arriving.
        received, sent = transport.start_exchange(sends, recvs, tag)
        for (own, piece), handle in zip(reductions, received, strict=False):
            handle.wait()
            combine(own, piece, op)
        for handle in received[len(reductions) :] + sent:
            handle.wait()


def _sends_overlap(
    sends: list[tuple[torch.Tensor, int]], reductions: list[tuple[torch.Tensor, torch.Tensor]]
) -> bool:
    """Whether a reduction target shares memory with a tensor being sent this round."""

    def span(t: torch.Tensor) -> tuple[int, int]:
        return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()

    targets = [span(own) for own, _ in reductions]
    for tensor, _ in sends:
        lo, hi = span(tensor)
        if any(lo < t_hi and t_lo < hi for t_lo, t_hi in targets):
            return True
    return False


def _pieces(chunk: torch.Tensor) -> list[torch.Tensor]:
    """A reduced chunk of more than :data:`PIECE_BYTES` as pieces of about that size, so the
    reduction of one piece overlaps the transfer of the next (as gloo's own ring does); sender
    and receiver cut the same chunk length the same way."""
    count = (chunk.numel() * chunk.element_size()) // PIECE_BYTES
    return list(torch.tensor_split(chunk, count)) if count >= 2 else [chunk]


class Collective:
    """A collective algorithm: builds :class:`Schedule` s and runs them in place.

    Subclasses set ``name`` and ``kinds`` (the operations they implement) and ``build``."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name

    def schedule(self, world_size: int, n: int, kind: str | None = None, root: int = 0) -> Schedule:
        """The schedule of ``kind`` (default: the first of ``kinds``) for ``n`` elements."""
        kind = kind or self.kinds[0]
        self._check_kind(kind)
        if not 0 <= root < world_size:
            raise TetherError(f"root {root} is not a rank of a group of {world_size}")
        return self.build(kind, world_size, n, root)

    def _check_kind(self, kind: str) -> None:
        if kind not in self.kinds:
            raise TetherError(
                f"collective {self.name!r} does not implement {kind}; it implements "
                f"{', '.join(self.kinds)}"
            )

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", comm: Comm = None) -> None:
        """Reduce ``tensor`` over the group, in place; every rank ends with the same result."""
        self._run("all_reduce", tensor, op, 0, comm)

    def broadcast(self, tensor: torch.Tensor, src: int, comm: Comm = None) -> None:
        """Overwrite ``tensor`` on every rank with rank ``src``'s (a rank within ``comm``)."""
        self._run("broadcast", tensor, "sum", src, comm)

    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int,
        op: str = "sum",
        comm: Comm = None,
    ) -> None:
        """Reduce into ``tensor`` on rank ``dst``; elsewhere ``tensor`` ends unspecified."""
        self._run("reduce", tensor, op, dst, comm)

    def _run(self, kind: str, tensor: torch.Tensor, op: str, root: int, comm: Comm) -> None:
        self._check_kind(kind)
        check_op(op, tensor.dtype)
        transport = as_transport(comm)
        world = transport.world_size
        if not 0 <= root < world:
            raise TetherError(f"root {root} is not a rank of a group of {world}")
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
        self.execute(kind, flat, op, root, transport)
        if op == "avg" and (kind == "all_reduce" or transport.rank == root):
            flat.div_(world)
        if not tensor.is_contiguous():
            tensor.copy_(flat.view(tensor.shape))

    def execute(
        self, kind: str, flat: torch.Tensor, op: str, root: int, transport: Transport
    ) -> None:
        schedule = self.schedule(transport.world_size, flat.numel(), kind, root)
        run_schedule(schedule, flat, op, transport)
