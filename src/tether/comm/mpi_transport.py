"""The MPI transport: the same interface as :class:`~tether.comm.transport.TorchTransport`, on
mpi4py (MPICH from the ``tether[mpi]`` extra, or the site's MPI).

Why a second transport: MPI libraries move small messages in a few microseconds over shared
memory or an HPC interconnect, cheaper per message than gloo's TCP path, and HPC sites
launch jobs with ``mpiexec``/``srun`` rather than a TCP rendezvous. Methods and the collective
algorithms of :mod:`tether.comm.collectives` run unchanged on either transport.

Buffers are CPU tensors handed to MPI without a copy: MPI gets the tensor's own memory, by
address and size (mpi4py's ``buffer.fromaddress``; cheaper per call than ``tensor.numpy()``, which
matters for the small messages this transport is for), and every tensor is held until the
operation that uses it completes.
Point-to-point transfers (``exchange`` and the message protocol) move raw bytes (``MPI_BYTE``,
MPI-3.1 section 3.2.2), so every dtype travels, bfloat16 and float16 included, which have no
MPI datatype in MPI-3.1; the peers are homogeneous machines and the message header already
carries the dtype. Native reductions need a typed buffer: float32, float64 and the integer types
map to MPI's predefined types; bfloat16 and float16 are reduced in a float32 copy and rounded back
once (twice the bytes on the wire, and at least as accurate as reducing in 16 bits).

mpi4py is imported when a transport is built, never when :mod:`tether` is, so the package works
without it; asking for MPI without it is a one-line :class:`~tether.errors.TetherError`.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import torch

from tether.comm.chunks import chunk_bounds
from tether.comm.header import ProtocolError
from tether.comm.messages import MessageProtocol, message_tags
from tether.comm.transport import Transport
from tether.errors import TetherError

INSTALL_HINT = "pip install 'tether[mpi]' (mpi4py and mpich)"
REDUCE_OPS = ("sum", "max", "min")
# Reduced in float32 and rounded back: MPI-3.1 has no 16-bit floating-point datatype.
STAGED_DTYPES = (torch.bfloat16, torch.float16)
# A receive with a timeout polls; the pause between polls grows to this many seconds.
MAX_POLL_PAUSE = 1e-3


def load_mpi() -> Any:
    """The ``mpi4py.MPI`` module, or a one-line TetherError saying how to install it.

    Importing ``mpi4py.MPI`` initialises MPI (``MPI_Init_thread`` with ``MPI_THREAD_MULTIPLE``,
    which the parameter server's listener threads need); a process that was not started by
    ``mpiexec`` becomes a singleton MPI job of one rank (MPI-3.1 section 10.5.2)."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise TetherError(f"the MPI transport needs mpi4py: {INSTALL_HINT}") from exc
    except RuntimeError as exc:  # mpi4py is there but found no MPI library to load
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TetherError(
            f"mpi4py could not load an MPI library ({reason}): {INSTALL_HINT}"
        ) from exc
    return MPI


class MPIWork:
    """In-flight nonblocking MPI operations (an ``Iallreduce``, the ``Isend`` s of a message).

    The tensors are held here until completion: MPI-3.1 section 3.7.2 forbids touching the
    buffer of a pending request, and MPI holds only the address of a tensor's memory, which
    torch would free with the last reference. ``finish`` runs after completion (a float32 or contiguous working copy
    is copied back into the caller's tensor there), so the result is in place once ``wait``
    returns."""

    def __init__(
        self,
        mpi: Any,
        requests: list[Any],
        keep: list[Any],
        finish: Callable[[], None] | None = None,
    ) -> None:
        self._mpi = mpi
        self.requests = requests
        self.keep = keep
        self._finish = finish

    def wait(self) -> None:
        if self.requests:
            self._mpi.Request.Waitall(self.requests)
            self.requests.clear()
        if self._finish is not None:
            self._finish()
            self._finish = None
        self.keep.clear()

    def is_completed(self) -> bool:
        """True once MPI has finished; the result is in place only after :meth:`wait`."""
        return not self.requests or bool(self._mpi.Request.Testall(self.requests))


class MPIRequest:
    """One in-flight ``MPI_Isend``/``MPI_Irecv`` of an exchange, holding the tensor whose memory
    it uses until ``wait`` (MPI-3.1 section 3.7.2; a send may be a contiguous copy that nothing
    else holds). Slimmer than :class:`MPIWork`, because exchanges run on every round of every
    collective: one ``MPI_Wait`` and no copy-back (ring all-reduce of 4 bytes on 2 ranks,
    MPICH on a 2-core VM: 62 -> 42 us a call)."""

    __slots__ = ("_request", "_tensor")

    def __init__(self, request: Any, tensor: torch.Tensor) -> None:
        self._request = request
        self._tensor: torch.Tensor | None = tensor

    def wait(self) -> None:
        self._request.Wait()
        self._tensor = None


class MPITransport(MessageProtocol):
    """MPI collectives and the header-checked point-to-point protocol, over an mpi4py
    communicator (default ``MPI.COMM_WORLD``).

    The communicator is duplicated (collectively: every rank builds its transport at the same
    point) so that Tether's tags never match the application's own messages on the same ranks:
    a communicator is MPI's isolation unit for libraries (MPI-3.1 section 6.1.2). Ranks are ranks
    of that communicator."""

    def __init__(self, comm: Any = None, dup: bool = True) -> None:
        mpi = load_mpi()
        self.MPI = mpi
        base = mpi.COMM_WORLD if comm is None else comm
        self.comm = base.Dup() if dup else base
        self.rank: int = self.comm.Get_rank()
        self.world_size: int = self.comm.Get_size()
        self._fromaddress = (getattr(mpi, "buffer", None) or mpi.memory).fromaddress  # mpi4py 4/3
        self._ops = {"sum": mpi.SUM, "max": mpi.MAX, "min": mpi.MIN}
        self._types = {
            torch.float32: mpi.FLOAT,
            torch.float64: mpi.DOUBLE,
            torch.int64: mpi.INT64_T,
            torch.int32: mpi.INT32_T,
            torch.int16: mpi.INT16_T,
            torch.int8: mpi.INT8_T,
            torch.uint8: mpi.UINT8_T,
        }

    def close(self) -> None:
        """Free the duplicated communicator (collective). Optional: MPI_Finalize frees it too."""
        if self.comm not in (self.MPI.COMM_WORLD, self.MPI.COMM_SELF, self.MPI.COMM_NULL):
            self.comm.Free()

    def _memory(self, tensor: torch.Tensor) -> Any:
        """The tensor's own memory as an MPI buffer: no copy, nothing holding the tensor alive."""
        assert tensor.is_cpu and tensor.is_contiguous(), "MPI buffers are contiguous CPU tensors"
        return self._fromaddress(tensor.data_ptr(), tensor.nbytes)

    # -- collectives ---------------------------------------------------------------------------
    def _typed(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
        """A contiguous buffer MPI can reduce, and what copies its result back (None: in place)."""
        if tensor.dtype in STAGED_DTYPES:
            work = tensor.detach().reshape(-1).float()
        elif tensor.dtype not in self._types:
            names = ", ".join(str(d) for d in (*self._types, *STAGED_DTYPES))
            raise TetherError(f"the MPI transport cannot reduce {tensor.dtype}; it reduces {names}")
        elif tensor.is_contiguous():
            return tensor, None
        else:
            work = tensor.detach().contiguous().view(-1)

        def copy_back() -> None:
            with torch.no_grad():
                tensor.copy_(work.view(tensor.shape))

        return work, copy_back

    def _op(self, op: str) -> Any:
        if op not in self._ops:
            raise TetherError(f"unknown reduce op {op!r}; the MPI transport has {REDUCE_OPS}")
        return self._ops[op]

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False) -> Any:
        """In-place all-reduce (``MPI_IN_PLACE``, MPI-3.1 section 5.9.6); with ``async_op`` an
        ``MPI_Iallreduce`` (section 5.12.8) whose handle's ``wait()`` leaves the result in
        ``tensor``."""
        mpi_op = self._op(op)
        work, copy_back = self._typed(tensor)
        spec = [self._memory(work), work.numel(), self._types[work.dtype]]
        if not async_op:
            self.comm.Allreduce(self.MPI.IN_PLACE, spec, op=mpi_op)
            if copy_back is not None:
                copy_back()
            return None
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, spec, op=mpi_op)
        return MPIWork(self.MPI, [request], [work, spec], copy_back)

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Any:
        """Overwrite ``tensor`` with rank ``src``'s. A broadcast does no arithmetic, so it moves
        bytes and takes every dtype."""
        strided = not tensor.is_contiguous()
        work = tensor.contiguous()  # the tensor itself unless strided
        spec = [self._memory(work), self.MPI.BYTE]

        def copy_back() -> None:
            with torch.no_grad():
                tensor.copy_(work)

        if not async_op:
            self.comm.Bcast(spec, root=src)
            if strided:
                copy_back()
            return None
        request = self.comm.Ibcast(spec, root=src)
        return MPIWork(self.MPI, [request], [work, spec], copy_back if strided else None)

    def reduce(self, tensor: torch.Tensor, dst: int, op: str = "sum") -> None:
        """Reduce into ``tensor`` on rank ``dst``; elsewhere ``tensor`` is left as it was. The
        root passes ``MPI_IN_PLACE`` as its send buffer (MPI-3.1 section 5.9.1)."""
        mpi_op = self._op(op)
        work, copy_back = self._typed(tensor)
        spec = [self._memory(work), work.numel(), self._types[work.dtype]]
        if self.rank == dst:
            self.comm.Reduce(self.MPI.IN_PLACE, spec, op=mpi_op, root=dst)
            if copy_back is not None:
                copy_back()
        else:
            self.comm.Reduce(spec, None, op=mpi_op, root=dst)

    def all_gather(self, tensor: torch.Tensor) -> None:
        """In-place all-gather (``MPI_Allgatherv`` with ``MPI_IN_PLACE``, MPI-3.1 section 5.7):
        rank r contributes chunk r of :func:`~tether.comm.chunks.chunk_bounds`, in bytes, so
        every dtype travels and uneven chunks need no padding."""
        assert tensor.is_contiguous(), "all_gather runs on a flat contiguous tensor"
        size = tensor.element_size()
        bounds = chunk_bounds(tensor.numel(), self.world_size)
        counts = [(stop - start) * size for start, stop in bounds]
        displacements = [start * size for start, _ in bounds]
        spec = [self._memory(tensor), counts, displacements, self.MPI.BYTE]
        self.comm.Allgatherv(self.MPI.IN_PLACE, spec)

    def barrier(self) -> None:
        self.comm.Barrier()

    def exchange(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
        tag: int,
    ) -> None:
        """Post every receive then every send of one round (``MPI_Irecv``/``MPI_Isend``, by
        :meth:`start_exchange`), then wait for all of them. Nonblocking calls make a round in
        which two ranks send to each other deadlock-free whatever the message size (MPI-3.1
        section 3.7); receives go first so that arriving data lands in its buffer instead of
        MPI's unexpected-message queue. Receive buffers must be contiguous (they are views of
        the collective's flat tensor)."""
        received, sent = self.start_exchange(sends, recvs, tag)
        for work in received + sent:
            work.wait()

    def start_exchange(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
        tag: int,
    ) -> tuple[list[MPIRequest], list[MPIRequest]]:
        """Post like :meth:`exchange`; return (one handle per receive, in order; one per send).
        MPI matches one sender's messages on one tag in posting order (non-overtaking, MPI-3.1
        section 3.5)."""
        comm, byte, memory = self.comm, self.MPI.BYTE, self._memory
        received = [
            MPIRequest(comm.Irecv([memory(b), byte], source=p, tag=tag), b) for b, p in recvs
        ]
        sent = []
        for tensor, peer in sends:
            held = tensor.contiguous()  # the tensor itself unless strided
            sent.append(MPIRequest(comm.Isend([memory(held), byte], dest=peer, tag=tag), held))
        return received, sent

    # -- point to point ------------------------------------------------------------------------
    def _send_parts(self, parts: list[tuple[torch.Tensor, int]], dst: int) -> MPIWork:
        requests = [
            self.comm.Isend([self._memory(t), self.MPI.BYTE], dest=dst, tag=tag) for t, tag in parts
        ]
        return MPIWork(self.MPI, requests, [t for t, _ in parts])

    def discard_payload(self, src: int, channel: int = 0) -> int:
        """Receive and drop the next payload from ``src`` (after a refused header whose sender is
        known to have sent one); returns its size in bytes. Blocks until it arrives."""
        status = self.MPI.Status()
        _, payload_tag = message_tags(channel)
        self.comm.Probe(source=src, tag=payload_tag, status=status)
        size = status.Get_count(self.MPI.BYTE)
        self.comm.Recv([bytearray(size), self.MPI.BYTE], source=src, tag=payload_tag)
        return size

    def _recv(
        self,
        tensor: torch.Tensor,
        src: int | None,
        tag: int,
        timeout: datetime.timedelta | None,
        what: str = "header",
    ) -> int:
        """Receive into ``tensor`` from ``src`` (None: ``MPI_ANY_SOURCE``); returns the sender's
        rank. A message longer than the buffer is an MPI error (truncation, MPI-3.1 section
        3.2.4); a shorter one is refused here. MPI receives have no timeout of their own, so a
        timed receive polls ``MPI_Test`` (adding up to a millisecond of latency) and on expiry
        cancels the receive (section 3.8.4) and raises TimeoutError. A header refused by the
        protocol leaves its payload (if the peer sent one) unreceived: :meth:`discard_payload`
        drains it."""
        mpi = self.MPI
        source = mpi.ANY_SOURCE if src is None else src
        data, status = [self._memory(tensor), mpi.BYTE], mpi.Status()
        try:
            self._receive(data, source, tag, status, timeout)
        except mpi.Exception as exc:
            if exc.Get_error_class() != mpi.ERR_TRUNCATE:
                raise
            raise ProtocolError(
                f"{what} from rank {status.Get_source()} is longer than the {tensor.nbytes} bytes "
                "expected (MPI: message truncated)"
            ) from None
        sender = status.Get_source()
        count = status.Get_count(mpi.BYTE)
        if count != tensor.nbytes:
            raise ProtocolError(
                f"{what} from rank {sender} has {count} bytes, expected {tensor.nbytes}"
            )
        return int(sender)

    def _receive(
        self, data: list, source: int, tag: int, status: Any, timeout: datetime.timedelta | None
    ) -> None:
        """The receive itself (blocking, or polled until ``timeout``); MPI errors propagate."""
        if timeout is None:
            self.comm.Recv(data, source=source, tag=tag, status=status)
        else:
            request = self.comm.Irecv(data, source=source, tag=tag)
            deadline = time.monotonic() + timeout.total_seconds()
            pause = 1e-5
            while not request.Test(status):
                if time.monotonic() > deadline:
                    request.Cancel()
                    request.Wait(status)
                    if status.Is_cancelled():
                        raise TimeoutError(f"no message on tag {tag} within {timeout}")
                    break  # it matched before the cancel took effect: keep it
                time.sleep(pause)
                pause = min(2 * pause, MAX_POLL_PAUSE)


def _is_a_transport(transport: MPITransport) -> Transport:
    """Never called: makes mypy check that MPITransport satisfies the Transport protocol."""
    return transport
