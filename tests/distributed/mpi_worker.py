"""The per-rank half of tests/distributed/test_mpi_transport.py, run under ``mpiexec``:
``python -m tests.distributed.mpi_worker MODE`` from the repository root.

Modes: ``all`` (the collectives, then the message protocol, which needs 3 or more ranks) and
``collectives``. Every rank prints ``RANK r OK <checks>`` or ``RANK r FAIL <what>`` lines and
exits 1 on any failure; an exception prints its traceback and aborts the whole job
(``MPI_Abort``), so that no rank waits forever in a collective its peer will never join.
Failures are collected rather than raised so that every rank keeps making the same calls.

Tolerances and data are those of tests/distributed/test_collectives.py, repeated here because
importing that module would load the whole launcher into every rank: exact for integers, max and
broadcasts; float sums within ``2 * gamma_P * sum_r |x_r|`` (divided by P for avg), with
``gamma_P = P*u / (1 - P*u)``, the worst-case bound of summing P terms in any order (Higham,
"Accuracy and Stability of Numerical Algorithms", 2nd ed., section 4.2).
"""

from __future__ import annotations

import datetime
import sys
import time
import traceback

import torch

from tests.distributed.collective_checks import Checks, close, gathered, sample
from tether.comm.collectives import COLLECTIVES, collectives_for
from tether.comm.collectives.chain import Chain
from tether.comm.header import HEADER_WORDS, MessageHeader, MessageKind, ProtocolError
from tether.comm.messages import PAYLOAD_TAG
from tether.comm.mpi_transport import MPITransport
from tether.comm.transport import HEADER_TAG
from tether.errors import TetherError

DTYPES = (torch.float32, torch.float64, torch.int64, torch.bfloat16)
# "auto" picks one of the others per size after a timed calibration: the others are checked here.
SKIP = {"auto"}


def _names(kind: str) -> list[str]:
    return [n for n in collectives_for(kind) if n not in SKIP]


def _lengths(world: int) -> list[int]:
    return sorted({1, world - 1, 1000, 100_003})


def _run(t: MPITransport, collective, kind: str, data: torch.Tensor, op="sum", root=0):
    collective = COLLECTIVES.get(collective) if isinstance(collective, str) else collective
    tensor = data.clone()
    if kind == "all_reduce":
        collective.all_reduce(tensor, op, comm=t)
    elif kind == "reduce":
        collective.reduce(tensor, root, op, comm=t)
    elif kind == "all_gather":
        collective.all_gather(tensor, comm=t)
    else:
        collective.broadcast(tensor, root, comm=t)
    return tensor


def _exact(inputs: list[torch.Tensor], op: str, world: int) -> torch.Tensor:
    """The reduction computed locally from every rank's input: sums in float64 (exact in int64)."""
    stacked = torch.stack(inputs)
    if op == "max":
        return stacked.amax(0)
    if stacked.dtype == torch.int64:
        return stacked.sum(0)
    total = stacked.double().sum(0)
    return total / world if op == "avg" else total


def _identical_everywhere(t: MPITransport, result: torch.Tensor) -> bool:
    first = result.clone()
    t.broadcast(first, 0)
    flag = torch.tensor([int(torch.equal(first, result))])
    t.all_reduce(flag, "min")
    return bool(flag.item())


def _all_reduces(t: MPITransport, checks: Checks) -> None:
    world, rank = t.world_size, t.rank
    seed = 0
    for n in _lengths(world):
        for dtype in DTYPES:
            for op in ("sum", "max") if dtype == torch.int64 else ("sum", "avg", "max"):
                seed += 1
                inputs = [sample(seed, r, n, dtype) for r in range(world)]
                abs_sum = torch.stack([x.double().abs() for x in inputs]).sum(0)
                exact = _exact(inputs, op, world)
                naive = _run(t, "naive", "all_reduce", inputs[rank], op)
                native = _run(t, "native", "all_reduce", inputs[rank], op)
                for name in _names("all_reduce"):
                    ours = _run(t, name, "all_reduce", inputs[rank], op)
                    case = f"{name} all_reduce P={world} n={n} {dtype} {op}"
                    checks.expect(close(ours, naive, op, world, abs_sum), f"{case} vs naive")
                    checks.expect(close(ours, native, op, world, abs_sum), f"{case} vs native")
                    checks.expect(close(ours, exact, op, world, abs_sum), f"{case} vs exact")
                    if name != "native":  # MPI does not promise identical results everywhere
                        checks.expect(_identical_everywhere(t, ours), f"{case}: ranks differ")


def _broadcasts_and_reduces(t: MPITransport, checks: Checks) -> None:
    world, rank = t.world_size, t.rank
    root = world - 1  # a non-zero root
    for n in _lengths(world):
        for dtype in DTYPES:
            data = sample(7, rank, n, dtype)
            expected = sample(7, root, n, dtype)
            for collective in [*_names("broadcast"), Chain(chunks=5)]:
                ours = _run(t, collective, "broadcast", data, root=root)
                checks.expect(torch.equal(ours, expected), f"{collective} broadcast n={n} {dtype}")
            for op in ("sum", "max"):
                inputs = [sample(11, r, n, dtype) for r in range(world)]
                abs_sum = torch.stack([x.double().abs() for x in inputs]).sum(0)
                exact = _exact(inputs, op, world)
                native = _run(t, "native", "reduce", inputs[rank], op, root)
                for name in _names("reduce"):
                    ours = _run(t, name, "reduce", inputs[rank], op, root)
                    if rank == root:
                        case = f"{name} reduce P={world} n={n} {dtype} {op}"
                        checks.expect(close(ours, native, op, world, abs_sum), f"{case} vs native")
                        checks.expect(close(ours, exact, op, world, abs_sum), f"{case} vs exact")


def _all_gathers(t: MPITransport, checks: Checks) -> None:
    """Exact on every rank, MPI's own ``Allgatherv`` (uneven chunks, every dtype) included."""
    world, rank = t.world_size, t.rank
    for n in _lengths(world):
        for dtype in DTYPES:
            inputs = [sample(13, r, n, dtype) for r in range(world)]
            expected = gathered(inputs)
            for name in _names("all_gather"):
                ours = _run(t, name, "all_gather", inputs[rank])
                checks.expect(torch.equal(ours, expected), f"{name} all_gather n={n} {dtype}")


def _transport_calls(t: MPITransport, checks: Checks) -> None:
    """The transport's own calls on what collectives never hand it: non-contiguous and staged
    (bf16) tensors, min, the nonblocking forms, and a communicator whose ranks are renumbered."""
    world, rank = t.world_size, t.rank
    triangle = world * (world + 1) / 2
    matrix = (torch.arange(12.0).reshape(3, 4) * (rank + 1)).t()  # not contiguous
    t.all_reduce(matrix)
    checks.expect(torch.equal(matrix, torch.arange(12.0).reshape(3, 4).t() * triangle), "strided")
    half = (torch.arange(8.0) * (rank + 1)).to(torch.bfloat16)[::2]  # staged and strided
    t.all_reduce(half, "min")
    checks.expect(torch.equal(half, torch.arange(0.0, 8.0, 2).to(torch.bfloat16)), "bf16 min")
    pending = t.all_reduce(torch.full((5,), float(rank), dtype=torch.bfloat16), async_op=True)
    value = torch.full((100,), rank + 1.0, dtype=torch.bfloat16)
    work = t.all_reduce(value, "sum", async_op=True)
    pending.wait()
    work.wait()
    checks.expect(bool((value == triangle).all()), "async bf16 all_reduce")
    for tensor, op, message in (
        (torch.zeros(2, dtype=torch.bool), "sum", "cannot reduce torch.bool"),
        (torch.zeros(2), "avg", "unknown reduce op 'avg'"),
    ):  # refused on every rank before MPI is called
        try:
            t.all_reduce(tensor, op)
            checks.expect(False, f"{message}: accepted")
        except TetherError as exc:
            checks.expect(message in str(exc) and "\n" not in str(exc), str(exc))
    chunk = torch.arange(10.0) if rank == 1 else torch.zeros(10)
    t.broadcast(chunk[::2], 1, async_op=True).wait()
    checks.expect(torch.equal(chunk[::2], torch.arange(0.0, 10.0, 2)), "async strided broadcast")
    # a strided send goes as a contiguous copy that only its request holds until completion
    after, before = (rank + 1) % world, (rank - 1) % world
    incoming = torch.zeros(10)
    received, sent = t.start_exchange(
        [((torch.arange(20.0) + 100 * rank)[::2], after)], [(incoming, before)], tag=77
    )
    for handle in received + sent:
        handle.wait()
    expected = torch.arange(0.0, 20.0, 2) + 100 * before
    checks.expect(torch.equal(incoming, expected), "exchange of a strided tensor")
    # reduced chunks in 4 KiB pieces: the pipelined path of the schedule runner on MPI
    from tether.comm.collectives import base

    saved, base.PIECE_BYTES = base.PIECE_BYTES, 4096
    try:
        data = sample(5, rank, 100_000, torch.int64)
        native = _run(t, "native", "all_reduce", data)
        for name in ("ring", "halving-doubling", "recursive-doubling", "binomial"):
            out = _run(t, name, "all_reduce", data)
            checks.expect(torch.equal(out, native), f"{name} in 4 KiB pieces")
    finally:
        base.PIECE_BYTES = saved
    if world > 2:  # ranks 1..P-1 as a communicator of their own: ranks there start at 0
        sub = t.comm.Split(0 if rank else t.MPI.UNDEFINED, rank)
        if rank:
            inner = MPITransport(sub)
            value = torch.full((7,), float(rank))
            for name in ("ring", "halving-doubling", "binomial"):
                out = _run(inner, name, "all_reduce", value)
                expected = torch.full((7,), world * (world - 1) / 2)  # ranks 1..P-1
                checks.expect(torch.equal(out, expected), f"sub {name}")
            out = _run(inner, Chain(chunks=2), "broadcast", value, root=1)
            checks.expect(torch.equal(out, torch.full((7,), 2.0)), "sub chain")
            inner.close()
            sub.Free()


def protocol(t: MPITransport, checks: Checks) -> None:
    """Rank 0 receives; ranks 1 and 2 send. Phases are separated by barriers so that a later
    message from one sender cannot race an earlier any-source receive meant for another."""
    _any_source(t, checks)
    t.barrier()
    _refused_then_accepted(t, checks)
    t.barrier()
    if t.rank == 1:  # the timed-out, cancelled receive on channel 3 swallowed nothing
        t.send_message(torch.tensor([42.0]), 0, MessageKind.PARAMS, channel=3)
    elif t.rank == 0:
        msg = t.recv_message(torch.zeros(16), src=1, channel=3)
        checks.expect(msg.payload.tolist() == [42.0], "channel 3 after a cancelled receive")
    t.barrier()


def _any_source(t: MPITransport, checks: Checks) -> None:
    if t.rank == 0:
        buffer, senders = torch.zeros(16), []
        for _ in range(2):  # whichever of ranks 1 and 2 is first
            msg = t.recv_message(buffer, src=None, kinds=frozenset({MessageKind.GRADIENT}))
            s = msg.header.sender
            senders.append(s)
            checks.expect(torch.equal(msg.payload, torch.full((s + 3,), float(s))), f"from {s}")
            checks.expect(msg.header.step == 10 * s, f"step from {s}")
        checks.expect(sorted(senders) == [1, 2], f"any-source senders {senders}")
    elif t.rank in (1, 2):
        payload = torch.full((t.rank + 3,), float(t.rank))
        t.isend_message(payload, 0, MessageKind.GRADIENT, step=10 * t.rank).wait()


BF16 = torch.tensor([0.5, -1.25, 3.0, 1e-3, 7.0], dtype=torch.bfloat16)


def _refused(t: MPITransport, checks: Checks, buffer, expected: str, drained: int | None) -> None:
    """The next message from rank 2 is refused with ``expected`` in the error; its payload of
    ``drained`` bytes (None: there is none) is then drained so the stream can go on."""
    try:
        t.recv_message(buffer, src=2)
        checks.expect(False, f"accepted a message that should fail with {expected!r}")
    except ProtocolError as exc:
        checks.expect(expected in str(exc), f"{str(exc)!r} lacks {expected!r}")
        if drained is not None:
            checks.expect(t.discard_payload(2) == drained, f"drained {drained} bytes")


def _refused_then_accepted(t: MPITransport, checks: Checks) -> None:
    if t.rank == 0:
        t.send_message(torch.arange(5.0), dst=1, kind=MessageKind.PARAMS, step=1)
        buffer = torch.zeros(16)
        # Longer than posted: MPI's truncation error, as a ProtocolError (it was a raw
        # MPI.Exception), for a header and for a payload longer than its header.
        _refused(
            t,
            checks,
            buffer,
            f"header from rank 2 is longer than the {HEADER_WORDS * 8} bytes",
            None,
        )
        _refused(t, checks, buffer, "payload from rank 2 is longer than the 16 bytes", None)
        _refused(t, checks, buffer, "announces 32 elements, buffer holds 16", 128)
        _refused(t, checks, buffer, "carries torch.float64, this side expects torch.float32", 32)
        _refused(t, checks, buffer, "claims to come from rank 1", None)
        buffers = {
            MessageKind.PARAMS: torch.zeros(16),
            MessageKind.GRADIENT: torch.zeros(8, dtype=torch.bfloat16),
            MessageKind.STOP: torch.zeros(0, dtype=torch.int64),
        }
        _refused(t, checks, buffers, "has kind 6, expected", 12)  # no buffer for DELTA
        got = {}
        for _ in range(2):  # rank 2's bf16 GRADIENT and rank 1's STOP, in either order
            msg = t.recv_message(buffers, src=None)
            got[msg.header.kind] = (msg.header.sender, msg.payload.clone())
        sender, payload = got.get(MessageKind.GRADIENT, (None, None))
        checks.expect(sender == 2, f"gradient from {sender}")
        checks.expect(payload is not None and torch.equal(payload, BF16), "bf16 payload")
        sender, payload = got.get(MessageKind.STOP, (None, None))
        checks.expect(sender == 1 and payload is not None and payload.numel() == 0, "stop")
        try:  # nothing is sent on channel 3 yet: the receive times out and is cancelled
            t.recv_message(buffer, src=1, channel=3, timeout=datetime.timedelta(seconds=0.2))
            checks.expect(False, "timed receive returned")
        except TimeoutError:
            checks.expect(True, "timeout")
    elif t.rank == 1:
        msg = t.recv_message(torch.zeros(8), src=0)
        checks.expect(msg.payload.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0], "params")
        t.send_message(torch.empty(0, dtype=torch.int64), 0, MessageKind.STOP)
    elif t.rank == 2:
        t.comm.Send(
            [torch.zeros(10, dtype=torch.int64).numpy(), t.MPI.BYTE], dest=0, tag=HEADER_TAG
        )
        short = MessageHeader(MessageKind.PARAMS, 2, 0, 4, torch.float32).encode()
        t.comm.Send([short.numpy(), t.MPI.BYTE], dest=0, tag=HEADER_TAG)
        t.comm.Send([torch.ones(8).numpy(), t.MPI.BYTE], dest=0, tag=PAYLOAD_TAG)
        t.send_message(torch.ones(32), 0, MessageKind.PARAMS)
        t.send_message(torch.ones(4, dtype=torch.float64), 0, MessageKind.PARAMS)
        forged = MessageHeader(MessageKind.PARAMS, 1, 0, 4, torch.float32).encode()
        t.comm.Send([forged.numpy(), t.MPI.BYTE], dest=0, tag=HEADER_TAG)
        t.send_message(torch.ones(3), 0, MessageKind.DELTA)
        t.send_message(BF16, 0, MessageKind.GRADIENT)


def main(mode: str) -> int:
    torch.set_num_threads(1)
    t = MPITransport()
    checks = Checks()
    phases = [_all_reduces, _broadcasts_and_reduces, _all_gathers, _transport_calls]
    if mode == "all":
        assert t.world_size >= 3, "the protocol checks need 3 ranks"
        phases.append(protocol)
    seconds = []
    try:
        for phase in phases:
            start = time.perf_counter()
            phase(t, checks)
            seconds.append(f"{phase.__name__.strip('_')} {time.perf_counter() - start:.1f} s")
    except BaseException:
        print(f"RANK {t.rank} FAIL exception:\n{traceback.format_exc()}", flush=True)
        t.MPI.COMM_WORLD.Abort(2)
    for failure in checks.failures:
        print(f"RANK {t.rank} FAIL {failure}", flush=True)
    if not checks.failures:
        print(f"RANK {t.rank} OK {checks.count} checks ({', '.join(seconds)})", flush=True)
    t.close()
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "all"))
