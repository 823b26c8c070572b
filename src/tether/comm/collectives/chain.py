"""Pipelined chunked chain broadcast: the root cuts the vector into C chunks and each rank of the
chain root -> root+1 -> ... forwards chunk k while it receives chunk k+1.

The pipelined chain of MVAPICH2-GDR / OSU-Caffe (Awan et al. 2017, "S-Caffe: co-designing MPI
runtimes and Caffe for scalable deep learning on modern GPU clusters", PPoPP; docs/communication.md). Chunk k crosses hop j in round k + j, so the broadcast takes ``P - 2 + C``
rounds of ``a + n/C*b``; :func:`choose_chunks` picks C minimising that, which approaches ``n*b``
for large n, against ``ceil(log2 P)*n*b`` for a binomial tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from tether.comm.collectives.base import Collective, run_schedule
from tether.comm.collectives.schedule import Schedule, Step
from tether.comm.transport import Transport

# Of the order of gloo over loopback TCP; `auto` and `tether bench comm` use the measured values
# (tether.comm.calibration.model.Calibration.instantiate).
DEFAULT_ALPHA = 50e-6  # seconds per message
DEFAULT_BETA = 1e-9  # seconds per byte
MAX_CHUNKS = 1024


def chain_time(world_size: int, chunks: int, n_bytes: float, alpha: float, beta: float) -> float:
    """``(P - 2 + C)*(a + n/C*b)``: the alpha-beta time of the pipelined chain."""
    if world_size < 2:
        return 0.0
    return (world_size - 2 + chunks) * (alpha + n_bytes / chunks * beta)


def choose_chunks(
    world_size: int, n_bytes: float, alpha: float, beta: float, max_chunks: int = MAX_CHUNKS
) -> int:
    """The chunk count C in ``[1, max_chunks]`` minimising :func:`chain_time`; the continuous
    optimum is ``sqrt((P-2)*n*b/a)``, and the better of its two integer neighbours is taken."""
    max_chunks = max(1, max_chunks)
    if world_size <= 2:
        return 1  # no hop to overlap with: C rounds of a + n/C*b only add latency
    if alpha <= 0:
        return max_chunks
    best = math.sqrt((world_size - 2) * n_bytes * beta / alpha)
    candidates = {min(max(c, 1), max_chunks) for c in (math.floor(best), math.ceil(best))}
    return min(candidates, key=lambda c: (chain_time(world_size, c, n_bytes, alpha, beta), c))


@lru_cache(maxsize=256)
def chain_broadcast(world_size: int, root: int, chunks: int) -> Schedule:
    p, steps = world_size, []
    for k in range(chunks):
        for j in range(p - 1):
            steps.append(Step(k + j, (root + j) % p, (root + j + 1) % p, k, "copy"))
    return Schedule("chain", p, tuple(steps), chunks=chunks, root=root)


@dataclass(frozen=True)
class Chain(Collective):
    """Pipelined chunked chain broadcast, chunk count from the alpha-beta model (OSU)."""

    name = "chain"
    kinds = ("broadcast",)
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    chunks: int | None = None  # None: choose_chunks
    element_size: int = 4  # bytes per element assumed by schedule(); execution uses the tensor's

    def num_chunks(self, world_size: int, n: int, element_size: int) -> int:
        limit = max(1, min(n, MAX_CHUNKS))
        if self.chunks is not None:
            return max(1, min(self.chunks, n))
        return choose_chunks(world_size, n * element_size, self.alpha, self.beta, limit)

    def build(self, kind: str, world_size: int, n: int, root: int) -> Schedule:
        return chain_broadcast(world_size, root, self.num_chunks(world_size, n, self.element_size))

    def execute(
        self, kind: str, flat: torch.Tensor, op: str, root: int, transport: Transport
    ) -> None:
        world = transport.world_size
        chunks = self.num_chunks(world, flat.numel(), flat.element_size())
        run_schedule(chain_broadcast(world, root, chunks), flat, op, transport)
