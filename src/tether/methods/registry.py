"""``METHODS``: the training methods a user picks by name (``--method``), in one table.

Every family of components is registered the same way: its package's registry module imports the
members and registers each under its user-visible name with a one-line help.
"""

from __future__ import annotations

from tether.methods.async_easgd import AsyncEASGD
from tether.methods.async_measgd import AsyncMEASGD
from tether.methods.async_msgd import AsyncMSGD
from tether.methods.async_sgd import AsyncSGD
from tether.methods.base import TrainingMethod
from tether.methods.hogwild_easgd import HogwildEASGD
from tether.methods.hogwild_sgd import HogwildSGD
from tether.methods.local_sgd import LocalSGD
from tether.methods.original_easgd import OriginalEASGD
from tether.methods.sync_easgd import SyncEASGD
from tether.methods.sync_sgd import SyncSGD
from tether.methods.two_level_easgd import TwoLevelEASGD
from tether.registry import Registry

METHODS: Registry[type[TrainingMethod]] = Registry("method")
for _method, _help in (
    (SyncSGD, "synchronous SGD: bucketed all-reduce of gradients, overlapped"),
    (SyncEASGD, "synchronous EASGD: one all-reduce per round, overlapped"),
    (LocalSGD, "local SGD, replicas averaged every tau steps"),
    (TwoLevelEASGD, "sync SGD inside each node, sync EASGD across nodes (SC17's KNL design)"),
    (OriginalEASGD, "EASGD, center served round-robin by rank (baseline)"),
    (AsyncEASGD, "EASGD, first-come-first-served server, serialized updates"),
    (AsyncMEASGD, "async EASGD with Nesterov momentum on the workers"),
    (HogwildEASGD, "EASGD with a lock-free center (shared memory; server threads across nodes)"),
    (AsyncSGD, "parameter-server SGD, first-come-first-served"),
    (AsyncMSGD, "parameter-server SGD with momentum on the server"),
    (HogwildSGD, "lock-free SGD on weights in shared memory (one node)"),
):
    METHODS.register(_method.name, help=_help)(_method)

# The method-specific settings (config keys); a method reads the ones in its ``settings``, and
# setting one it does not read warns that it has no effect.
METHOD_SETTINGS: frozenset[str] = frozenset().union(*(METHODS.get(n).settings for n in METHODS))
