"""Calibrate the alpha-beta-gamma model on the running transport, and predict collective times.

ALGORITHMS.md section 2: a message of n bytes costs ``a + n*b`` and reducing n bytes ``n*g``.
:func:`calibrate` measures them where our algorithms will run, through the same point-to-point
``exchange`` the schedule runner uses (so ``a`` includes the per-message software overhead our
runner pays, as Hockney's model intends): ``a`` is the one-way time of a 4-byte ping-pong,
``b`` the slope between two large ping-pongs, ``g`` the time per byte of an in-place add. When
the ranks span several nodes (ranks per node from the launcher, or given), the ping-pong is also
run between two nodes and the schedule's inter-node steps are priced with those values.

The formula predicts from these three numbers (``tether bench comm`` prints it beside every
measurement), but it cannot know what a machine does to a chain of dependent rounds: with more
ranks than cores, every round waits for the next rank to be scheduled, so a 6-round ring costs far
more than 6 ping-pongs. And the backend's own collectives are opaque (gloo and NCCL switch
algorithms by size). So the calibration also TIMES every candidate algorithm, native included,
at a few sizes on the running group (interpolated log-log between them), and ``auto`` chooses by
those times: by the model where they are missing, and ``native`` unless another algorithm beat
it clearly (by a margin in the median and in nearly every round, each round timing every
algorithm under the same conditions) at the timed sizes on both sides of the message, so noise
and interpolation do not make ``auto`` slower than the backend.

Every rank must call :func:`calibrate` / :func:`load_or_calibrate` together (they are
collective). Rank 0 measures or reads the cache and broadcasts the numbers, so every rank holds
the same calibration and ``auto`` makes the same choice everywhere (a different choice on two
ranks would deadlock their schedules). Results are cached per backend, world size, node size and
host in :func:`tether.launch.env.cache_dir`.
"""

from __future__ import annotations

import bisect
import json
import math
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tether.comm.collectives.auto import Auto
from tether.comm.collectives.schedule import NodeLinks, cost
from tether.comm.transport import Transport
from tether.observe.files import atomic_write_text
from tether.perf.timed_algorithms import candidates, instantiate, time_algorithms

if TYPE_CHECKING:
    from tether.comm.collectives.base import Collective

CALIBRATION_TAG = 7900
PING_SIZES = (4, 256 << 10, 4 << 20)
KINDS = Auto.kinds  # what auto picks for, so what is timed
# 6: rounds of back-to-back calls (tether.perf.rounds); 7: all-gather timed too, and an untimed
# call before every round at every size, as the benchmark does
VERSION = 7


@dataclass(frozen=True)
class Calibration:
    """alpha (s), beta (s/byte), gamma (s/byte) of one link level, the inter-node level where
    there are several nodes, and measured times of the backend's own collectives."""

    world_size: int
    ranks_per_node: int
    alpha: float
    beta: float
    gamma: float
    inter_alpha: float
    inter_beta: float
    # kind -> algorithm -> [(bytes, seconds)], ascending in bytes: measured times per call
    measured: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    # kind -> algorithm -> the timed sizes (bytes) at which it beat native clearly
    # (timed_algorithms.beats_clearly): the only evidence auto leaves native for
    clear_wins: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    backend: str = ""
    host: str = ""
    measured_at: str = ""

    @property
    def inter(self) -> NodeLinks | None:
        if self.ranks_per_node >= self.world_size:
            return None
        return NodeLinks(self.ranks_per_node, self.inter_alpha, self.inter_beta)

    def measured_time(self, algorithm: str, kind: str, n_bytes: float) -> float | None:
        """Interpolated (log-log) measured time per call; beyond the largest measured size,
        proportional to the size (bandwidth bound); None if not measured."""
        points = self.measured.get(kind, {}).get(algorithm)
        if not points:
            return None
        sizes = [p[0] for p in points]
        if n_bytes <= sizes[0]:
            return points[0][1]
        if n_bytes >= sizes[-1]:
            return points[-1][1] * n_bytes / sizes[-1]
        i = bisect.bisect_right(sizes, n_bytes)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        w = (math.log(n_bytes) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))

    def instantiate(self, algorithm: str) -> Collective:
        """The registered algorithm with this calibration's parameters: the chain's chunk count
        from the measured alpha and beta, the hierarchical node size that was calibrated."""
        return instantiate(algorithm, self.alpha, self.beta, self.ranks_per_node)

    def predict(self, algorithm: str, kind: str, n_bytes: float) -> float | None:
        """The alpha-beta-gamma model's seconds for ``algorithm``'s ``kind`` on ``n_bytes`` bytes
        (native and auto: the measured times, which they are chosen by); None where there is no
        model (an algorithm that does not implement ``kind``)."""
        if algorithm == "native":
            return self.measured_time("native", kind, n_bytes)
        if algorithm == "auto":
            return self.measured_time(self.choose(kind, n_bytes), kind, n_bytes)
        collective = self.instantiate(algorithm)
        if kind not in collective.kinds or self.world_size < 2:
            return None
        n_elements = max(1, int(n_bytes) // 4)
        schedule = collective.schedule(self.world_size, n_elements, kind)
        return cost(schedule, n_bytes, self.alpha, self.beta, self.gamma, self.inter)

    def choose(self, kind: str, n_bytes: float) -> str:
        """The algorithm ``auto`` runs for ``n_bytes``: native, unless another algorithm beat
        native clearly (:attr:`clear_wins`) at the timed size(s) that bracket ``n_bytes`` (the
        size itself if it was timed, else the one below and the one above), then the fastest
        such one there; by the model when nothing was timed."""
        native = dict(self.measured.get(kind, {}).get("native", []))
        if not native:
            modelled = [(t, n) for n in candidates(kind) if (t := self.predict(n, kind, n_bytes))]
            return min(modelled)[1] if modelled else "native"
        # Between two timed sizes the times are interpolated, and two curves that cross
        # between the points can put a loser ahead there (4 ranks: binomial 2.2x native at
        # 1 MiB ran 0.99x at 4 MiB when the choice came from interpolating 1 and 8 MiB): the
        # evidence for leaving native must hold at both ends. Beyond the largest timed size
        # there is no evidence at all, only an extrapolation (2 ranks: the naive algorithm,
        # timed fastest up to 8 MiB, ran 0.74x native at 64 MiB).
        sizes = sorted(native)
        if n_bytes > sizes[-1]:
            return "native"
        ends = {
            sizes[bisect.bisect_left(sizes, n_bytes)],
            sizes[max(0, bisect.bisect_right(sizes, n_bytes) - 1)],
        }
        winners = {
            name: self.measured_time(name, kind, n_bytes) or math.inf
            for name, won_at in self.clear_wins.get(kind, {}).items()
            if ends <= set(won_at)
        }
        if not winners:
            return "native"
        return min(winners, key=lambda name: (winners[name], name))

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, **asdict(self)}, indent=2)

    @staticmethod
    def from_json(text: str) -> Calibration:
        data = json.loads(text)
        if data.pop("version", None) != VERSION:
            raise ValueError("calibration file from another version")
        data["measured"] = {
            kind: {name: [tuple(p) for p in points] for name, points in algos.items()}
            for kind, algos in data["measured"].items()
        }
        return Calibration(**data)


def _one_way_time(transport: Transport, a: int, b: int, n_bytes: int, reps: int) -> float:
    """Half the round trip of ``n_bytes`` between ranks a and b (other ranks return 0)."""
    buf = torch.zeros(max(1, n_bytes // 4), dtype=torch.float32)
    rank = transport.rank
    if rank not in (a, b):
        return 0.0
    peer = b if rank == a else a
    for i in range(reps + 1):  # the first round trip warms the connection up, untimed
        if i == 1:
            start = time.perf_counter()
        if rank == a:
            transport.exchange([(buf, peer)], [], CALIBRATION_TAG)
            transport.exchange([], [(buf, peer)], CALIBRATION_TAG)
        else:
            transport.exchange([], [(buf, peer)], CALIBRATION_TAG)
            transport.exchange([(buf, peer)], [], CALIBRATION_TAG)
    return (time.perf_counter() - start) / (2 * reps)


def _link(transport: Transport, a: int, b: int) -> tuple[float, float]:
    """(alpha, beta) of the link between ranks a and b, measured on rank a."""
    times = [_one_way_time(transport, a, b, n, 30 if n < 1024 else 5) for n in PING_SIZES]
    alpha = times[0]
    slope = (times[2] - times[1]) / (PING_SIZES[2] - PING_SIZES[1])
    # On a busy machine the smaller transfer can take longer than the larger one; the time per
    # byte of the larger alone (an upper bound) is then a better estimate than a slope of <= 0.
    beta = slope if slope > 0 else times[2] / PING_SIZES[2]
    return alpha, beta


def _gamma() -> float:
    x, y = torch.ones(1 << 20), torch.ones(1 << 20)  # 4 MiB of float32
    x.add_(y)
    start = time.perf_counter()
    for _ in range(5):
        x.add_(y)
    return (time.perf_counter() - start) / (5 * x.numel() * 4)


def calibrate(transport: Transport, ranks_per_node: int, backend: str = "") -> Calibration:
    """Measure alpha, beta, gamma (and the inter-node alpha, beta) and time the algorithms.
    Collective: every rank calls it; every rank returns rank 0's numbers."""
    world = transport.world_size
    values = torch.zeros(5, dtype=torch.float64)
    if world >= 2:
        alpha, beta = _link(transport, 0, 1)
        inter_alpha, inter_beta = alpha, beta
        if ranks_per_node < world:
            inter_alpha, inter_beta = _link(transport, 0, ranks_per_node)
        values = torch.tensor([alpha, beta, _gamma(), inter_alpha, inter_beta], dtype=torch.float64)
        transport.broadcast(values, 0)
    a, b, g, ia, ib = (float(v) for v in values)
    measured, clear_wins = {}, {}
    if world >= 2:
        for kind in KINDS:
            measured[kind], clear_wins[kind] = time_algorithms(
                transport, kind, a, b, ranks_per_node
            )
    return Calibration(
        world_size=world,
        ranks_per_node=ranks_per_node,
        alpha=a,
        beta=b,
        gamma=g,
        inter_alpha=ia,
        inter_beta=ib,
        measured=measured,
        clear_wins=clear_wins,
        backend=backend,
        host=socket.gethostname(),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def cache_path(backend: str, world_size: int, ranks_per_node: int, pinned: bool = False) -> Path:
    """Where a calibration is cached: per host, backend, group shape, and whether the ranks'
    main threads were pinned (``tether bench comm --pin``), so that a pinned recalibration never
    drives the choices of unpinned training."""
    from tether.launch.env import cache_dir

    host = socket.gethostname()
    shape = f"{host}-{backend}-p{world_size}-g{ranks_per_node}"
    return cache_dir() / "calibration" / f"{shape}{'-pinned' if pinned else ''}.json"


def load_or_calibrate(
    transport: Transport,
    ranks_per_node: int | None = None,
    refresh: bool = False,
    backend: str | None = None,
) -> Calibration:
    """The cached calibration of this host/backend/group shape, measured once if there is none
    (or ``refresh``). Collective: rank 0 decides and its result reaches every rank."""
    from tether.comm.collectives.hierarchical import Hierarchical
    from tether.launch.affinity import pinned_core

    world = transport.world_size
    per_node = ranks_per_node or Hierarchical().nodes_of(world)
    backend = backend if backend is not None else _backend_name()
    path = cache_path(backend, world, per_node, pinned_core() is not None)
    cached: Calibration | None = None
    why = "asked to measure again"
    if transport.rank == 0 and not refresh:
        why = "none cached for this host and group shape"
        if path.exists():
            try:
                cached = Calibration.from_json(path.read_text())
            except (ValueError, TypeError, KeyError):
                why = "the cached one is unreadable or from an older Tether"
    have = torch.tensor([1 if cached is not None else 0], dtype=torch.int64)
    if world > 1:
        transport.broadcast(have, 0)
    if int(have):
        return _share(transport, cached)
    # Tens of seconds before the first step of a training run: say what it is, once (rank 0).
    if transport.rank == 0:
        _say(
            f"calibrating the collectives ({backend}, {world} rank{'s' * (world > 1)},"
            f" {per_node} per node; {why}): tens of seconds, once"
        )
    start = time.perf_counter()
    result = calibrate(transport, per_node, backend)
    if transport.rank == 0:
        atomic_write_text(path, result.to_json())
        _say(f"calibration done in {time.perf_counter() - start:.1f} s, cached in {path}")
    return result


def _say(message: str) -> None:
    print(f"tether: {message}", file=sys.stderr, flush=True)


def _share(transport: Transport, calibration: Calibration | None) -> Calibration:
    """Rank 0's calibration on every rank: the JSON text as bytes, its length sent first."""
    if transport.world_size == 1:
        assert calibration is not None
        return calibration
    data = calibration.to_json().encode() if calibration is not None else b""
    length = torch.tensor([len(data)], dtype=torch.int64)
    transport.broadcast(length, 0)
    buf = torch.zeros(int(length), dtype=torch.uint8)
    if transport.rank == 0:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    transport.broadcast(buf, 0)
    return Calibration.from_json(bytes(buf.tolist()).decode())


def _backend_name() -> str:
    import torch.distributed as dist

    return str(dist.get_backend()) if dist.is_initialized() else "mpi"
