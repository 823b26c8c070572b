"""Tether: communication-efficient distributed training for PyTorch.

The public API: configs, the registries users pick from, the method protocol, and the launcher.
The command line (``tether train``) is a thin layer over these.
"""

from tether.config import TrainConfig, resolve_config
from tether.errors import TetherError, WorkerFailure

__version__ = "0.1.0"

__all__ = [
    "TetherError",
    "TrainConfig",
    "WorkerFailure",
    "__version__",
    "resolve_config",
]
