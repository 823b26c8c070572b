"""What the collective tests on gloo (test_collectives.py) and on MPI (mpi_worker.py) share:
the inputs, the failure collector and the tolerance (Higham's bound; see test_collectives.py)."""

from __future__ import annotations

import torch

from tether.comm.chunks import chunk_bounds

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float64: 2.0**-53, torch.bfloat16: 2.0**-8}


def sample(seed: int, rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.int64:
        return torch.randint(-(10**6), 10**6, (n,), generator=g)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


class Checks:
    """Collects failures instead of raising, so that every rank keeps making the same calls."""

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []

    def expect(self, ok: bool, what: str) -> None:
        self.count += 1
        if not ok:
            self.failures.append(what)


def close(ours: torch.Tensor, ref: torch.Tensor, op: str, world: int, abs_sum) -> bool:
    """Integers and max exactly; float sums within 2 * gamma_P * sum|x_r| (/P for avg)."""
    if ours.dtype == torch.int64 or op == "max":
        return torch.equal(ours, ref)
    u = UNIT_ROUNDOFF[ours.dtype]
    bound = 2 * (world * u / (1 - world * u)) * abs_sum / (world if op == "avg" else 1)
    return bool(((ours.double() - ref.double()).abs() <= bound).all())


def gathered(inputs: list[torch.Tensor]) -> torch.Tensor:
    """What an all-gather must leave on every rank: chunk r of rank r's input, for every r."""
    bounds = chunk_bounds(inputs[0].numel(), len(inputs))
    return torch.cat([x[lo:hi] for x, (lo, hi) in zip(inputs, bounds, strict=True)])
