"""Non-blocking all-reduce of flat tensors with a chosen algorithm and wire format.

The training methods (sync-sgd's gradient buckets, sync-easgd's round sum, local-sgd's average)
start an all-reduce, keep computing, and wait later. The backend's own collective is
asynchronous already; our algorithms (:mod:`tether.comm.collectives`) are blocking sequences of
point-to-point rounds, so they run on one communication thread, in the order they were started,
which is the same on every rank (the collective-ordering contract). Only our point-to-point
tags ever travel on that thread: the backend's collectives are always issued from the caller's
thread, so their order across ranks cannot be changed by thread scheduling.

Reduced-precision wire formats (docs/communication.md; Jia et al. 2018): the vector is divided
by P in its own precision, cast to fp16 or bf16, summed on the wire, and cast back. Dividing
first means the fp16 sum of P values is bounded by the largest of them, so it overflows only if
an input already does (65504 is fp16's largest value), or lies within about P/2 fp16 steps of
it: the cast rounds ``x_i / P`` to nearest, up as well (65504 on 3 ranks: 3 x 21840 = 65520,
which fp16 rounds to inf; 65000 passes). Rounding toward zero would cost more passes over the
vector; under fp16 loss scaling such an inf is an overflow like any other (sync-sgd skips the
step and halves the scale). bf16 has fp32's range but 8 bits of mantissa. Each element of the mean is within ``(2P-1) * u * mean_i |x_i|`` of the exact one, with
``u = 2^-11`` (fp16) or ``2^-8`` (bf16): the P casts and the P-1 additions each round once;
for fp16 only while ``x_i / P`` stays above its smallest normal value (6.1e-5): smaller values
are subnormal, with fewer bits, down to 0 (bf16 keeps fp32's range).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from tether.comm.calibration.cache import load_or_calibrate
from tether.comm.collectives.auto import Auto
from tether.comm.collectives.base import Collective
from tether.comm.collectives.hierarchical import Hierarchical
from tether.comm.collectives.native import Native
from tether.comm.collectives.registry import COLLECTIVES
from tether.comm.comm_thread import CommThread
from tether.comm.transport import Transport
from tether.errors import TetherError
from tether.observe.timeline import get_timeline

WIRE_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class PendingReduce:
    """An all-reduce in flight. ``wait()`` leaves the sum (or mean) in the original tensor."""

    tensor: torch.Tensor
    wire: torch.Tensor  # the tensor on the wire: ``tensor`` itself, or its compressed copy
    # the wire result is divided (a mean, not pre-divided) or multiplied (a pre-divided sum) by P
    divide_by: int = 1
    multiply_by: int = 1
    native: object | None = None  # the backend's work handle
    future: Future | None = None  # the communication thread's job
    done: bool = False
    started: float = 0.0  # time.perf_counter() at the start
    trace: Callable[[PendingReduce], None] | None = None  # records a native op's span

    def wait(self) -> None:
        if self.done:
            return
        if self.native is not None:
            self.native.wait()  # type: ignore[attr-defined]
            if self.trace is not None:
                self.trace(self)
        if self.future is not None:
            self.future.result()  # re-raises the communication thread's error here
        if self.wire is not self.tensor:
            self.tensor.copy_(self.wire)
        if self.divide_by != 1:
            self.tensor.div_(self.divide_by)
        if self.multiply_by != 1:
            self.tensor.mul_(self.multiply_by)
        self.done = True


class AllReducer:
    """Starts all-reduces of flat tensors with ``algorithm`` (a name of
    :data:`~tether.comm.collectives.COLLECTIVES` implementing all-reduce, or "auto") and
    ``compress`` ("none", "fp16", "bf16").

    ``ranks_per_node``: the ranks of one node (consecutive ranks share a node), which the
    hierarchical algorithm and the calibration of "auto" use; 0 where the caller does not know
    the layout, which makes the whole group one node (correct, not tuned across nodes).
    ``cache_dir``: where "auto" keeps its calibration (measured once per host and group shape,
    :func:`~tether.comm.calibration.cache.load_or_calibrate`); None measures it for this reducer
    alone, tens of seconds every time. Building an "auto" reducer is collective: every rank
    builds its reducer at the same point of the run."""

    def __init__(
        self,
        transport: Transport,
        algorithm: str = "native",
        compress: str = "none",
        ranks_per_node: int = 0,
        *,
        cache_dir: Path | None = None,
    ) -> None:
        self.transport = transport
        self.world_size = transport.world_size
        if compress not in WIRE_DTYPES:
            raise TetherError(
                f"unknown all-reduce wire format {compress!r}; valid: {', '.join(WIRE_DTYPES)}"
            )
        self.wire_dtype = WIRE_DTYPES[compress]
        self.algorithm = self._resolve(algorithm, ranks_per_node, cache_dir)
        self._thread: CommThread | None = None
        self._last_native_end = 0.0

    def _resolve(self, algorithm: str, ranks_per_node: int, cache_dir: Path | None) -> Collective:
        if algorithm in ("hierarchical", "auto"):
            ranks_per_node = self._agreed_node_size(ranks_per_node, algorithm)
        if algorithm == "hierarchical":
            return Hierarchical(ranks_per_node=ranks_per_node or None)
        if algorithm == "auto":
            return Auto(load_or_calibrate(self.transport, cache_dir, ranks_per_node or None))
        return COLLECTIVES.get(algorithm)

    def _agreed_node_size(self, ranks_per_node: int, algorithm: str) -> int:
        """The node size every rank uses (collective: each rank knows only its own node's).
        Nodes of different sizes (``srun -n 4 -N 3``: 2, 1 and 1) built schedules that did not
        match, and every rank waited out the timeout blaming a live peer: ``hierarchical`` is
        refused on every rank, and ``auto`` calibrates the group as one node (0)."""
        sizes = torch.tensor([ranks_per_node, -ranks_per_node], dtype=torch.int64)
        self.transport.all_reduce(sizes, op="max")
        largest, smallest = int(sizes[0]), -int(sizes[1])
        if largest == smallest:
            return ranks_per_node
        if algorithm == "hierarchical":
            raise TetherError(
                f"the hierarchical all-reduce needs the same number of ranks on every node; "
                f"this run's nodes hold {smallest} to {largest}: use --allreduce ring (or auto), "
                "or an even layout (--ranks-per-node N for nodes of N)"
            )
        return 0

    def _chosen(self, wire: torch.Tensor) -> Collective:
        if isinstance(self.algorithm, Auto):
            n_bytes = wire.numel() * wire.element_size()
            return self.algorithm.choose("all_reduce", n_bytes, self.transport)
        return self.algorithm

    def start(self, tensor: torch.Tensor, average: bool) -> PendingReduce:
        """Start reducing the flat ``tensor`` in place (sum, or mean with ``average``)."""
        p = self.world_size
        if self.wire_dtype is not None and self.wire_dtype != tensor.dtype:
            wire = (tensor / p).to(self.wire_dtype)  # pre-divided: see the module docstring
            pending = PendingReduce(tensor, wire, multiply_by=1 if average else p)
        elif self.wire_dtype is not None and average:
            # already in the wire's format: divided in place first, for the same reason (an
            # fp16 mean of 40000 summed to inf on 2 ranks)
            tensor.div_(p)
            pending = PendingReduce(tensor, tensor)
            wire = tensor
        else:
            pending = PendingReduce(tensor, tensor, divide_by=p if average else 1)
            wire = tensor
        chosen = self._chosen(wire)
        pending.started = time.perf_counter()
        if isinstance(chosen, Native):
            pending.native = self.transport.all_reduce(wire, "sum", async_op=True)
            pending.trace = self._trace_native
        else:
            if self._thread is None:
                self._thread = CommThread()
            pending.future = self._thread.submit(lambda: self._run(chosen, wire))
        return pending

    def close(self) -> None:
        """End the communication thread (a later ``start`` makes a new one)."""
        if self._thread is not None:
            self._thread.close()
            self._thread = None

    def _trace_native(self, pending: PendingReduce) -> None:
        """The backend's work is opaque: the trace shows it from when it can have started (its
        launch, or the end of the previous one, since the backend runs them in order) to when
        its completion was seen, an upper bound on the transfer itself."""
        end = time.perf_counter()
        start = max(pending.started, self._last_native_end)
        self._last_native_end = end
        wire = pending.wire
        get_timeline().record(
            "all-reduce native",
            "comm.op",
            start,
            end,
            track="comm",
            bytes=wire.numel() * wire.element_size(),
        )

    def _run(self, collective: Collective, wire: torch.Tensor) -> None:
        start = time.perf_counter()
        collective.all_reduce(wire, "sum", comm=self.transport)
        get_timeline().record(
            f"all-reduce {collective.name}",
            "comm.op",
            start,
            time.perf_counter(),
            track="comm",
            bytes=wire.numel() * wire.element_size(),
        )
