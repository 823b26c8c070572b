"""What a parameter server knows about its workers while it serves
(:mod:`tether.methods.ps_server`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tether.observe.metrics import PhaseTotals


@dataclass(frozen=True)
class WorkerLost:
    rank: int
    reason: str


@dataclass
class ServerState:
    """What the server knows about its workers while it serves."""

    workers: list[int]
    local_steps: dict[int, int] = field(default_factory=dict)
    stopped: set[int] = field(default_factory=set)
    lost: dict[int, str] = field(default_factory=dict)
    # The lost ones given up as silent (hung, or stopped): at the end each is told so
    # (tether.methods.server_end_watch), the others were broken or dead.
    silent: set[int] = field(default_factory=set)
    totals: PhaseTotals = field(default_factory=PhaseTotals)
    # The sender of every data message, in the order the server took them (for tests and logs).
    arrivals: list[int] = field(default_factory=list)

    @property
    def active(self) -> list[int]:
        return [r for r in self.workers if r not in self.stopped and r not in self.lost]

    def global_step(self) -> int:
        """Local steps done by all workers, in units of one step of every worker."""
        return sum(self.local_steps.values()) // max(len(self.workers), 1)
