"""``COLLECTIVES``: the collective algorithms a user picks by name (``--allreduce ALGO``)."""

from __future__ import annotations

from tether.comm.collectives.auto import Auto
from tether.comm.collectives.base import Collective
from tether.comm.collectives.binomial import Binomial
from tether.comm.collectives.chain import Chain
from tether.comm.collectives.halving_doubling import HalvingDoubling
from tether.comm.collectives.hierarchical import Hierarchical
from tether.comm.collectives.naive import Naive
from tether.comm.collectives.native import Native
from tether.comm.collectives.recursive_doubling import RecursiveDoubling
from tether.comm.collectives.ring import Ring
from tether.registry import Registry

COLLECTIVES: Registry[Collective] = Registry("collective")

for _collective in (
    Naive(),
    Ring(),
    HalvingDoubling(),
    RecursiveDoubling(),
    Binomial(),
    Chain(),
    Hierarchical(),
    Native(),
    Auto(),
):
    COLLECTIVES.register(_collective.name)(_collective)


def collectives_for(kind: str) -> list[str]:
    """Names of the registered collectives that implement ``kind`` (e.g. "broadcast")."""
    return [name for name in COLLECTIVES if kind in COLLECTIVES.get(name).kinds]
