"""Training methods, one per module, behind :class:`~tether.methods.base.TrainingMethod`."""

from tether.methods import sync_sgd as _sync_sgd  # noqa: F401  (registers itself)
from tether.methods.base import MethodContext, Role, StepTimes, TrainingMethod
from tether.methods.registry import METHODS

__all__ = ["METHODS", "MethodContext", "Role", "StepTimes", "TrainingMethod"]
