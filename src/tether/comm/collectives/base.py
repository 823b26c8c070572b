"""Run a :class:`Schedule` over a transport's point-to-point calls, and the uniform interface.

Every algorithm of this package is a :class:`Collective`: it builds schedules, and this module
runs them with the transport's nonblocking point-to-point calls on tensor chunks (one round's
sends and receives posted together, then waited on, so two ranks exchanging in one round cannot
deadlock; on gloo the group backend's own send/recv, on NCCL ``dist.batch_isend_irecv``, on MPI
``Isend``/``Irecv``). Each rank's part of a schedule is compiled once into element ranges
(:mod:`tether.comm.collectives.plan`), and a 1-D tensor's views of them are cut once
(:mod:`tether.comm.collectives.views`). Sizes come from the schedule, known to both sides, so no
header travels; a reduced chunk is received into a buffer of exactly its size.

Collectives use tags ``COLLECTIVE_TAG + round % TAG_SPAN``, apart from the parameter-server
protocol's 7001/7002 (+10 per channel), so the two never match each other's messages; distinct
tags for consecutive rounds keep a rank that runs ahead from matching an earlier round. As in MPI,
every rank of a group calls the same collectives in the same order, one at a time. On NCCL,
whose first batched point-to-point call on a group must involve every rank, make one ordinary
collective call (a barrier) on the group before the first schedule runs.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.distributed as dist

from tether.comm.collectives.plan import RoundPlan, compile_plan
from tether.comm.collectives.schedule import Schedule
from tether.comm.collectives.views import (
    RoundTensors,
    cached_views,
    remember_views,
    round_tensors,
)
from tether.comm.transport import TorchTransport, Transport
from tether.errors import TetherError

# What a collective runs on: a transport (torch or MPI), or a torch process group (None: WORLD),
# which is wrapped in a TorchTransport.
Comm = Transport | dist.ProcessGroup | None


def as_transport(comm: Comm) -> Transport:
    # A transport is recognised by its world_size attribute (a ProcessGroup has a size()
    # method instead): isinstance(x, dist.ProcessGroup) goes through torch's Python metaclass,
    # ~4 us a test, twice per collective call.
    if comm is not None and hasattr(comm, "world_size"):
        return comm  # type: ignore[return-value]
    return TorchTransport(comm)


COLLECTIVE_TAG = 8000
PIECE_BYTES = 4 << 20  # reduced chunks larger than two of these travel in pieces
TAG_SPAN = 1000
KINDS = ("all_reduce", "broadcast", "reduce", "all_gather")
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


def _tag(rp: RoundPlan) -> int:
    return COLLECTIVE_TAG + rp.round % TAG_SPAN


def run_schedule(schedule: Schedule, flat: torch.Tensor, op: str, comm: Comm) -> None:
    """Execute this rank's part of ``schedule`` on the contiguous 1-D tensor ``flat``.

    On CPU, a round's receives are posted before the previous round is waited on, wherever they
    land on nothing that round still uses (:attr:`RoundPlan.early`): gloo holds a message until
    its receive is posted (the receiver announces it, then the data flows), so a receive posted
    late costs a wake-up of the receiving rank per round, dear when ranks outnumber cores. Not on
    NCCL, which runs a receive posted before a send to the same peer ahead of it on one stream."""
    transport = as_transport(comm)
    assert flat.dim() == 1 and flat.is_contiguous(), "collectives run on flat contiguous tensors"
    assert schedule.world_size == transport.world_size, "schedule built for another group"
    plan = compile_plan(schedule, transport.rank, flat.numel(), flat.element_size(), PIECE_BYTES)
    post_early = flat.is_cpu  # (``device.type`` costs ~0.9 us, ``is_cpu`` ~0.1)
    posted: list | None = None  # this round's receive handles, when posted during the last one
    views = cached_views(plan, flat)
    fresh = views is None
    if views is None:  # cut round by round, so that the first round is posted at once
        alias, views = flat.detach(), []
        if plan:
            views.append(round_tensors(plan[0], alias, 0))
    for index, rp in enumerate(plan):
        sends, recvs, reductions = views[index]
        waited = -1  # -1 while posting, then the handles of ``received + sent`` waited on
        try:
            if posted is None:
                received, sent = transport.start_exchange(sends, recvs, _tag(rp))
            else:
                received, sent = posted, transport.start_exchange(sends, [], _tag(rp))[1]
            posted = None
            if index + 1 < len(plan):
                following = plan[index + 1]
                if fresh:
                    views.append(round_tensors(following, alias, (index + 1) % 2))
                if post_early and following.early:
                    posted = transport.start_exchange([], views[index + 1][1], _tag(following))[0]
            waited = 0
            if not rp.pipelined:
                # Sends read the start-of-round value: a chunk this rank also sends this round
                # (recursive doubling) is reduced into only after every transfer has completed.
                for handle in received + sent:
                    handle.wait()
                    waited += 1
                for own, piece in reductions:
                    combine(own, piece, op)
                continue
            # Pipelined: add piece k while pieces k+1... are still arriving.
            for (own, piece), handle in zip(reductions, received, strict=False):
                handle.wait()
                waited += 1
                combine(own, piece, op)
            for handle in received[len(reductions) :] + sent:
                handle.wait()
                waited += 1
        except RuntimeError as exc:  # gloo/NCCL timeouts and closed connections, MPI errors
            raise PeerStalled.naming(
                schedule, rp, transport.rank, views[index], waited, exc
            ) from exc
    if fresh:
        remember_views(plan, flat, views)


class PeerStalled(RuntimeError):
    """A transfer of a collective schedule failed or timed out (the backend's error is the
    cause). It names the peer this rank was waiting for, which the backend's own message does
    not: in a synchronous method the first rank to give up names the dead or hung one, or one
    stuck behind it."""

    @classmethod
    def naming(
        cls,
        schedule: Schedule,
        rp: RoundPlan,
        rank: int,
        transfers: RoundTensors,
        waited: int,
        cause: Exception,
    ) -> PeerStalled:
        """The error for the ``waited``-th handle of ``received + sent`` in round ``rp`` (or for
        posting the round, ``waited`` < 0)."""
        sends, recvs, _ = transfers
        if waited < 0:  # a backend that refuses to post on a connection already broken
            peers = sorted({p for _, p in recvs} | {p for _, p in sends})
            doing = "posting transfers with"
            who = f"rank {peers[0]}" if len(peers) == 1 else f"ranks {', '.join(map(str, peers))}"
        else:
            waiting = [("receiving from", p) for _, p in recvs]
            waiting += [("sending to", p) for _, p in sends]
            doing, peer = waiting[min(waited, len(waiting) - 1)]
            who = f"rank {peer}"
        backend = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        return cls(
            f"{schedule.name} schedule, rank {rank}: gave up {doing} {who} in round "
            f"{rp.round + 1} of {schedule.num_rounds} ({who} died, hangs, or is slower than the "
            f"timeout): {backend}"
        )


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
        self.run("all_reduce", tensor, op, 0, comm)

    def broadcast(self, tensor: torch.Tensor, src: int, comm: Comm = None) -> None:
        """Overwrite ``tensor`` on every rank with rank ``src``'s (a rank within ``comm``)."""
        self.run("broadcast", tensor, "sum", src, comm)

    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int,
        op: str = "sum",
        comm: Comm = None,
    ) -> None:
        """Reduce into ``tensor`` on rank ``dst``; elsewhere ``tensor`` ends unspecified."""
        self.run("reduce", tensor, op, dst, comm)

    def all_gather(self, tensor: torch.Tensor, comm: Comm = None) -> None:
        """Gather in place: rank r contributes chunk r of ``tensor`` (cut into P chunks, the first
        ``numel % P`` one element longer: :func:`tether.comm.chunks.chunk_bounds`), and every
        rank ends holding every rank's chunk (``MPI_Allgatherv`` with ``MPI_IN_PLACE``)."""
        self.run("all_gather", tensor, "sum", 0, comm)

    def run(
        self, kind: str, tensor: torch.Tensor, op: str = "sum", root: int = 0, comm: Comm = None
    ) -> None:
        """Run operation ``kind`` (one of :data:`KINDS`) in place: what :meth:`all_reduce`,
        :meth:`broadcast`, :meth:`reduce` and :meth:`all_gather` do (``op`` unused by the copying
        ones), for callers that pick the kind at run time (the benchmark, the calibration)."""
        self._check_kind(kind)
        check_op(op, tensor.dtype)
        transport = as_transport(comm)
        world = transport.world_size
        if not 0 <= root < world:
            raise TetherError(f"root {root} is not a rank of a group of {world}")
        if tensor.is_contiguous():
            # a 1-D tensor goes as itself, so that its views are cut once (collectives.views)
            flat = tensor if tensor.dim() == 1 else tensor.view(-1)
        else:
            flat = tensor.contiguous().view(-1)
        self.execute(kind, flat, op, root, transport)
        with torch.no_grad():  # a parameter's values are reduced: not a step of its graph
            if op == "avg" and (
                kind == "all_reduce" or (kind == "reduce" and transport.rank == root)
            ):
                flat.div_(world)
            if not tensor.is_contiguous():
                tensor.copy_(flat.view(tensor.shape))

    def execute(
        self, kind: str, flat: torch.Tensor, op: str, root: int, transport: Transport
    ) -> None:
        # ``run`` checked kind and root already (``schedule`` would check them again)
        schedule = self.build(kind, transport.world_size, flat.numel(), root)
        run_schedule(schedule, flat, op, transport)
