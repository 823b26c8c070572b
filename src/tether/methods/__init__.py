"""Training methods, one per module, behind :class:`~tether.methods.base.TrainingMethod`.

Importing this package registers every method in :data:`METHODS`.
"""

from tether.methods import (  # noqa: F401  (each module registers itself)
    async_easgd,
    async_measgd,
    async_msgd,
    async_sgd,
    hogwild_easgd,
    hogwild_sgd,
    local_sgd,
    original_easgd,
    sync_easgd,
    sync_sgd,
)
from tether.methods.base import MethodContext, Role, StepTimes, TrainingMethod
from tether.methods.registry import METHODS

__all__ = ["METHODS", "MethodContext", "Role", "StepTimes", "TrainingMethod"]
