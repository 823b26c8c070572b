"""What a calibration holds, and what it decides: the alpha-beta-gamma parameters of the running
group's links, the measured times of the candidate algorithms, the predictions made from them,
``auto``'s choice per message size, and the JSON form in which it is cached and shared.

Why the model alone is not enough, and how the choice stays on native unless another algorithm
clearly beat it: :mod:`tether.comm.calibration`. Every rank holds rank 0's calibration
(:func:`tether.comm.calibration.cache.load_or_calibrate`), so ``auto`` makes the same choice
everywhere (a different choice on two ranks would deadlock their schedules).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field
from functools import cached_property

from tether.comm.calibration.round_fit import RoundCost, fit_round_cost
from tether.comm.calibration.timed_algorithms import candidates, instantiate
from tether.comm.collectives.base import Collective
from tether.comm.collectives.schedule import NodeLinks, cost, shared_core_cost

# 6: rounds of back-to-back calls (tether.comm.calibration.rounds); 7: all-gather timed too, and
# an untimed call before every round at every size, as the benchmark does; 8: the node's cores
VERSION = 8


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
    # the CPUs a one-node group's ranks run on where those CPUs move the bytes (loopback TCP,
    # shared memory); 0: links of their own (NCCL) or several nodes
    cores: int = 0

    @cached_property
    def round_cost(self) -> RoundCost | None:
        """The shared-core model's round cost fitted to this group's timed all-reduce algorithms
        (:mod:`tether.comm.calibration.round_fit`); None off a shared-core node or unmeasured."""
        if self.cores < 1:
            return None
        measured = self.measured.get("all_reduce", {})
        return fit_round_cost(measured, self.world_size, self.gamma, self.cores)

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
        model (an algorithm that does not implement ``kind``). On a node whose CPUs move the
        bytes, the shared-core cost with the fitted round cost (:attr:`round_cost`), else the
        single-port cost with the ping-pong's numbers."""
        if algorithm == "native":
            return self.measured_time("native", kind, n_bytes)
        if algorithm == "auto":
            return self.measured_time(self.choose(kind, n_bytes), kind, n_bytes)
        collective = self.instantiate(algorithm)
        if kind not in collective.kinds or self.world_size < 2:
            return None
        n_elements = max(1, int(n_bytes) // 4)
        schedule = collective.schedule(self.world_size, n_elements, kind)
        rounds = self.round_cost
        if rounds is not None:
            a, a1, b = rounds.alpha, rounds.one_way_alpha, rounds.beta
            return shared_core_cost(schedule, n_bytes, a, b, self.gamma, self.cores, a1)
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

    def round_cost_json(self) -> dict[str, float] | None:
        """:attr:`round_cost` with the cores it was fitted for, as a report states it."""
        rounds = self.round_cost
        return None if rounds is None else {**asdict(rounds), "cores": self.cores}

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
