"""How many cores this machine gives the job: the cpuset of the process's control group, which
a container (``docker --cpuset-cpus``) or a SLURM job (``ConstrainCores``) narrows to its own
cores, else every core the machine has.

:mod:`tether.launch.partition` compares a process's affinity mask with it: a mask no wider than
the job's cores shared among the node's processes is a task's own binding, a mask as wide as the
job's cores is the share they all start from. ``os.cpu_count`` alone would take a job confined
to a few cores of a large node, all its tasks sharing them, for tasks bound one by one.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_cpu_list(text: str) -> set[int]:
    """A kernel CPU list: ``0-3,8,10-11`` -> {0, 1, 2, 3, 8, 10, 11}; ValueError otherwise."""
    cpus: set[int] = set()
    for item in text.strip().split(","):
        if not item:
            continue
        low, _, high = item.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def cgroup_cpus(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> set[int] | None:
    """The cores this process's cpuset cgroup allows (None where none can be read): cgroup v1's
    ``cpuset`` hierarchy, else v2's unified one. A group with no file of its own (v2 without the
    cpuset controller there, or a container that mounts its group as the root) has its nearest
    ancestor's cores."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    places: list[tuple[Path, str, tuple[str, ...]]] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if "cpuset" in controllers.split(","):
            places.insert(0, (root / "cpuset", path, ("cpuset.effective_cpus", "cpuset.cpus")))
        elif controllers == "":
            places.append((root, path, ("cpuset.cpus.effective",)))
    for base, path, names in places:
        directory = base / path.lstrip("/")
        while True:
            for name in names:
                try:
                    cpus = parse_cpu_list((directory / name).read_text())
                except (OSError, ValueError):
                    continue
                if cpus:
                    return cpus
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return None


def job_core_count() -> int:
    """The number of cores this machine gives the job: its cpuset's, else the machine's."""
    cpus = cgroup_cpus()
    return len(cpus) if cpus else os.cpu_count() or 1
