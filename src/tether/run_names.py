"""The default name of an output directory: what made it and when (``runs/sync-sgd-20261128-061500``,
``runs/predict-20261128-061500``), so that runs started one after another never share one."""

from __future__ import annotations

import datetime


def run_stamp() -> str:
    """The local time to the second, as an output directory's suffix: ``20261128-061500``."""
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
