"""Tether: communication-efficient distributed training for PyTorch.

The public API::

    result = tether.fit(model=..., train_data=..., loss=..., method="sync-easgd", workers=4)
    ctx = tether.init(method="sync-easgd"); model, opt = ctx.wrap(model, opt)   # your own loop
    work = tether.time_model(net, x, y, loss)                    # the performance model:
    tether.predict(work, "sync-sgd", workers=8, profile="p40-cluster")   # docs/performance.md
    cal = tether.calibrate(model=..., train_data=..., loss=...)  # this machine, your model
    tether.predict(cal.workload, "sync-easgd", workers=4, profile=cal.profile)

``tether.metrics`` holds the evaluation metrics (``tether.metrics.accuracy``), ``tether.optim``
the optimizers and schedules (``tether.optim.LARS``, ``LAMB``, ``linear_scaling``); ``TrainConfig``
lists every option. The command line (``tether train``) is a thin layer over the same pieces.
Names are loaded on first use, so ``import tether`` (and ``tether --help``) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tether.config import TrainConfig
from tether.errors import TetherError, WorkerFailure

if TYPE_CHECKING:
    from tether import metrics, optim
    from tether.api.calibrate import Calibrated, calibrate
    from tether.api.context import Context
    from tether.api.fit import FitResult, fit
    from tether.api.init import init
    from tether.api.perf import predict, predict_scaling, simulate, time_model
    from tether.catalog import resolve_config
    from tether.perf.profile import load_profile

__version__ = "0.1.0"

# name -> (module, attribute); attribute None: the module itself
_LAZY: dict[str, tuple[str, str | None]] = {
    "fit": ("tether.api.fit", "fit"),
    "init": ("tether.api.init", "init"),
    "Context": ("tether.api.context", "Context"),
    "FitResult": ("tether.api.fit", "FitResult"),
    "metrics": ("tether.metrics", None),
    "optim": ("tether.optim", None),
    "resolve_config": ("tether.catalog", "resolve_config"),
    "time_model": ("tether.api.perf", "time_model"),
    "calibrate": ("tether.api.calibrate", "calibrate"),
    "Calibrated": ("tether.api.calibrate", "Calibrated"),
    "predict": ("tether.api.perf", "predict"),
    "predict_scaling": ("tether.api.perf", "predict_scaling"),
    "simulate": ("tether.api.perf", "simulate"),
    "load_profile": ("tether.perf.profile", "load_profile"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tether' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


__all__ = [
    "Calibrated",
    "Context",
    "FitResult",
    "TetherError",
    "TrainConfig",
    "WorkerFailure",
    "__version__",
    "calibrate",
    "fit",
    "init",
    "load_profile",
    "metrics",
    "optim",
    "predict",
    "predict_scaling",
    "resolve_config",
    "simulate",
    "time_model",
]
