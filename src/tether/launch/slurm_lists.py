"""SLURM's compact lists, as its variables write them (parsing only: nothing here reads the
environment, :mod:`tether.launch.env` passes the values in).

A step's tasks per node come run-length encoded, in the order of its node list:
``SLURM_STEP_TASKS_PER_NODE=2(x3),1`` is three nodes of 2 tasks and one of 1, so an uneven
step's nodes differ and a node's count is found by its index (SLURM_NODEID), not read off the
first entry.
"""

from __future__ import annotations

import re

_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def tasks_per_node(text: str) -> list[int]:
    """Each node's task count: ``2(x3),1`` -> ``[2, 2, 2, 1]``. ValueError for anything else."""
    counts: list[int] = []
    for item in text.split(","):
        match = _COUNT.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"not a SLURM tasks-per-node list: {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts
