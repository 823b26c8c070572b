"""SLURM's compact lists, as its variables write them (parsing only: nothing here reads the
environment, :mod:`tether.launch.env` passes the values in).

A node list is comma-separated names, each of which may hold several bracket groups of numbers
and ranges: ``a[1-3,5],b7`` is a1, a2, a3, a5 and b7; ``rack[1-2]-node[01-02]`` is rack1-node01,
rack1-node02, rack2-node01 and rack2-node02 (zero padding is part of the name).

A step's tasks per node come run-length encoded, in the order of its node list:
``SLURM_STEP_TASKS_PER_NODE=2(x3),1`` is three nodes of 2 tasks and one of 1, so an uneven
step's nodes differ and a node's count is found by its index (SLURM_NODEID), not read off the
first entry.
"""

from __future__ import annotations

import re

_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_FIRST_NAME = re.compile(r"(?:[^,\[]|\[[^\]]*\])*")  # up to the first comma outside brackets
_GROUP = re.compile(r"\[([^\]]*)\]")


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (127.0.0.1 for an empty one): each bracket group of
    the first name gives its first number, as written: ``node[01-04,07],gpu1`` -> ``node01``,
    ``rack[1-2]-node[01-02]`` -> ``rack1-node01``."""
    match = _FIRST_NAME.match(nodelist.strip())
    name = match.group(0) if match else ""
    host = _GROUP.sub(lambda group: re.split(r"[,-]", group.group(1))[0], name)
    return host or "127.0.0.1"


def tasks_per_node(text: str) -> list[int]:
    """Each node's task count: ``2(x3),1`` -> ``[2, 2, 2, 1]``. ValueError for anything else."""
    counts: list[int] = []
    for item in text.split(","):
        match = _COUNT.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"not a SLURM tasks-per-node list: {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts
