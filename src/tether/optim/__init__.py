"""Optimizers and learning-rate schedules: torch's own by name, and EAMSGD's look-ahead step.

Every method's local update is a ``torch.optim.Optimizer`` step (the one step seam); this package
holds the ones Tether builds from names and settings. Each is a plain torch optimizer or
scheduler, usable in a user's own loop.
"""

from tether.optim.builders import (
    LOCAL_STEPS,
    OPTIMIZERS,
    NamedOptimizer,
    OptimizerBuilder,
    OptimizerSettings,
    check_distributable,
    lookahead_nesterov,
    needs_closure,
    plain_sgd,
    sgd,
)
from tether.optim.lamb import LAMB
from tether.optim.lars import LARS
from tether.optim.lookahead_nesterov import LookaheadNesterov
from tether.optim.schedules import (
    SCHEDULES,
    NamedSchedule,
    ScheduleSettings,
    build_schedule,
    linear_scaling,
)

__all__ = [
    "LAMB",
    "LARS",
    "LOCAL_STEPS",
    "OPTIMIZERS",
    "SCHEDULES",
    "LookaheadNesterov",
    "NamedOptimizer",
    "NamedSchedule",
    "OptimizerBuilder",
    "OptimizerSettings",
    "ScheduleSettings",
    "build_schedule",
    "check_distributable",
    "linear_scaling",
    "lookahead_nesterov",
    "needs_closure",
    "plain_sgd",
    "sgd",
]
