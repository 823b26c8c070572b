"""Training methods, one per module, behind :class:`~tether.methods.base.TrainingMethod`;
:data:`METHODS` is the table of names."""

from tether.methods.base import Backward, MethodContext, Placement, Role, StepTimes, TrainingMethod
from tether.methods.registry import METHOD_SETTINGS, METHODS

__all__ = [
    "METHODS",
    "METHOD_SETTINGS",
    "Backward",
    "MethodContext",
    "Placement",
    "Role",
    "StepTimes",
    "TrainingMethod",
]
