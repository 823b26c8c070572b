"""The measurement loop of ``tether bench comm`` (run by every rank; the timing scheme is in
:mod:`tether.bench.comm`'s docstring): the exact correctness check, then timed repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO

from tether.bench.comm import MIN_REPEATS, REPEAT_BYTES, CommBenchArgs
from tether.bench.comm_spec import ELEMENT_BYTES, ROOT, format_size
from tether.comm.calibration.rounds import iters_for, rotated
from tether.errors import TetherError

if TYPE_CHECKING:  # torch is imported where it is used: `tether --help` need not load it
    import torch

    from tether.comm.collectives.base import Collective


def repeats_for(n_bytes: int, repeats: int) -> int:
    """Timed repeats for a size: ``repeats``, fewer above REPEAT_BYTES of traffic per size (but
    at least MIN_REPEATS, or ``repeats`` if that is smaller)."""
    budget = REPEAT_BYTES // (n_bytes * iters_for(n_bytes))
    return max(min(repeats, MIN_REPEATS), min(repeats, budget))


def lower_quartile(times: list[float]) -> float:
    """The time a quarter of the repeats beat: interference from the rest of the machine only
    ever adds time, so on a noisy one this moves far less from run to run than the median (2
    ranks on a 2-core VM: single 1 MiB calls are bimodal, 1.3 or 3.7 ms, and the median of 30
    lands in either mode)."""
    if len(times) < 2:
        return times[0]
    return statistics.quantiles(times, n=4, method="inclusive")[0]


def pattern(rank: int, n: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s input: small integers (1..13 times rank+1), so float32 sums over any
    realistic number of ranks are exact whatever order an algorithm adds them in."""
    import torch

    base = (torch.arange(n, device=device) % 13 + 1).to(torch.float32)
    return base * (rank + 1)


class Case:
    """The buffers of one (operation, size) on one rank: the input, the buffer the collective
    works in, and the result it must produce."""

    def __init__(
        self, kind: str, n_bytes: int, rank: int, world_size: int, device: torch.device
    ) -> None:
        import torch

        self.kind, self.rank = kind, rank
        n = max(1, n_bytes // ELEMENT_BYTES)
        if kind == "all_gather":
            # nccl-tests' size is the gathered output; each rank contributes 1/P of it: its own
            # chunk of the buffer, whose other chunks start as -1 and must all be overwritten.
            per_rank = max(1, n // world_size)
            self.init = torch.full((per_rank * world_size,), -1.0, device=device)
            self.init[rank * per_rank : (rank + 1) * per_rank] = pattern(rank, per_rank, device)
            self.expected = torch.cat([pattern(r, per_rank, device) for r in range(world_size)])
        else:
            self.init = pattern(rank, n, device)
            if kind == "broadcast":
                self.expected = pattern(ROOT, n, device)
            else:  # all_reduce, reduce: the sum of every rank's input
                self.expected = pattern(0, n, device) * (world_size * (world_size + 1) // 2)
        self.buf = self.init.clone()
        self.n_bytes = self.buf.numel() * ELEMENT_BYTES

    def reset(self) -> None:
        self.buf.copy_(self.init)

    def check(self) -> bool:
        """The result is exact; a reduce's result is only specified on the root."""
        import torch

        if self.kind == "reduce" and self.rank != ROOT:
            return True
        return bool(torch.equal(self.buf, self.expected))


def collective_call(
    kind: str, collective: Collective, case: Case, transport: Any
) -> Callable[[], None]:
    """One call of ``collective``'s ``kind`` on the case's buffer, in place."""
    return partial(collective.run, kind, case.buf, "sum", ROOT, transport)


def resolve(algos: list[str], given: Mapping[str, Collective] | None) -> dict[str, Collective]:
    """The collective to time for each name: the one ``given`` under it, else the registered
    one."""
    from tether.comm.collectives import COLLECTIVES

    given = given or {}
    return {algo: given[algo] if algo in given else COLLECTIVES.get(algo) for algo in algos}


def measure(
    transport: Any,
    args: CommBenchArgs,
    device: torch.device,
    sync: Callable[[], None] = lambda: None,
    predict: Callable[[str, str, float], float | None] | None = None,
    progress: TextIO | None = None,
    collectives: Mapping[str, Collective] | None = None,
) -> dict[str, Any]:
    """Time every algorithm of ``args`` at every size on ``transport`` (collective: every rank
    calls it). Returns the raw rows (meaningful on rank 0): per algorithm and size the median,
    lower quartile and mean time over repeats, the per-repeat times, the correct flag and the
    prediction. ``collectives``: the collective to time under a name where the registered one
    will not do (``auto`` with this group's calibration, ``hierarchical`` with its nodes)."""
    import torch

    rank, world = transport.rank, transport.world_size
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    algos = list(args.algos)
    timed = resolve(algos, collectives)
    started = last_note = time.perf_counter()
    transport.barrier()  # NCCL: a plain collective before the first batched point-to-point
    measured: set[int] = set()
    for index, size in enumerate(args.sizes):
        case = Case(args.kind, size, rank, world, device)
        if case.n_bytes in measured:  # an all-gather below 4P bytes gathers one float32 per rank
            continue
        measured.add(case.n_bytes)
        iters, repeats = iters_for(case.n_bytes), repeats_for(case.n_bytes, args.repeats)
        calls: dict[str, tuple[Callable[[], None], bool]] = {}
        for algo in list(algos):
            now = time.perf_counter()
            if progress is not None and (now - last_note > 2.0 or (index, algo) == (0, algos[0])):
                progress.write(
                    f"tether bench: {format_size(size)} {algo} ({index + 1}/{len(args.sizes)} "
                    f"sizes, {now - started:.0f} s)\n"
                )
                progress.flush()
                last_note = now
            call = collective_call(args.kind, timed[algo], case, transport)
            correct, error = _check_once(call, case, sync)
            # Every rank must agree to skip an algorithm (e.g. one that refuses this group size).
            status = torch.tensor([int(error is not None), int(not correct)], device=device)
            transport.all_reduce(status, "max")
            if int(status[0]):
                skipped[algo] = error or "failed on another rank"
                algos.remove(algo)
                continue
            calls[algo] = (call, not int(status[1]))
        # Repeats interleaved across the algorithms (the first round is the warm-up), so that
        # a slow spell of the machine hits them alike: the ratios are measured side by side.
        mine: dict[str, list[float]] = {algo: [] for algo in calls}
        for round_ in range(repeats + 1):
            for algo in rotated(list(calls), round_):
                mine[algo] += _timed_repeats(calls[algo][0], case, transport, sync, iters, 1)
        for algo, (_, correct) in calls.items():
            slowest = torch.tensor(mine[algo][1:], dtype=torch.float64, device=device)
            transport.all_reduce(slowest, "max")  # a collective ends when its last rank does
            per_repeat = [float(t) for t in slowest.cpu()]
            rows.append(
                {
                    "algo": algo,
                    "bytes": case.n_bytes,
                    "time_s": statistics.median(per_repeat),
                    "quartile_s": lower_quartile(per_repeat),
                    "mean_s": statistics.fmean(per_repeat),
                    "times_s": per_repeat,
                    "iters": iters,
                    "repeats": repeats,
                    "correct": correct,
                    "predicted_s": (
                        predict(algo, args.kind, case.n_bytes) if predict and rank == 0 else None
                    ),
                }
            )
        del case
    return {"rows": rows, "skipped": skipped, "bench_s": time.perf_counter() - started}


def _check_once(
    call: Callable[[], None], case: Case, sync: Callable[[], None]
) -> tuple[bool, str | None]:
    """One untimed call on the known input: (result exact, refusal message). An algorithm that
    refuses the size or group (a TetherError before anything is sent) is skipped, not failed."""
    case.reset()
    try:
        call()
    except TetherError as exc:
        return False, str(exc)
    sync()
    return case.check(), None


def _timed_repeats(
    call: Callable[[], None],
    case: Case,
    transport: Any,
    sync: Callable[[], None],
    iters: int,
    repeats: int,
) -> list[float]:
    """This rank's seconds per call in each repeat (the first repeat is the warm-up), each repeat
    after one untimed call. The buffer is reset outside the timed region so that repeated
    in-place sums cannot overflow."""
    times = []
    for _ in range(repeats):
        # One untimed call first: the first call after another algorithm carries that one's
        # aftermath (2 ranks here: gloo's all-reduce right after our recursive doubling ran
        # 25-35% slower than right after itself), which is not this algorithm's cost.
        call()
        case.reset()
        sync()
        transport.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        sync()
        times.append((time.perf_counter() - start) / iters)
    return times
