"""Collective algorithms on point-to-point messages, each also a schedule (data).

Pick one by name from :data:`COLLECTIVES`; every algorithm has the same interface
(:class:`Collective`: ``all_reduce``, ``broadcast``, ``reduce`` where it implements them, and
``schedule``). Costs and closed forms: docs/communication.md.
"""

from tether.comm.collectives.base import Collective, run_schedule
from tether.comm.collectives.registry import COLLECTIVES, collectives_for
from tether.comm.collectives.schedule import (
    NodeLinks,
    Schedule,
    Step,
    chunk_bounds,
    cost,
    simulate,
)

__all__ = [
    "COLLECTIVES",
    "Collective",
    "NodeLinks",
    "Schedule",
    "Step",
    "chunk_bounds",
    "collectives_for",
    "cost",
    "run_schedule",
    "simulate",
]
