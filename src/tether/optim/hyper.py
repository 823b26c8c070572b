"""The checks of an optimizer's hyperparameters (Tether's LARS, LAMB and look-ahead Nesterov).

A comparison alone lets NaN through (``nan <= 0`` is False), and a NaN rate, ``eta`` or
``eps`` fills the weights with NaN at the first step without a word: every value must be a
finite number in its range. One value per message, named as the constructor names it.
"""

from __future__ import annotations

import math


def require_in_range(
    name: str, value: float, least: float, *, above: bool = False, below: float | None = None
) -> None:
    """A ``ValueError`` unless ``value`` is a finite number ``>= least`` (``> least`` with
    ``above``) and, given ``below``, ``< below``."""
    if below is not None:
        wanted = f"in {'(' if above else '['}{least:g}, {below:g})"
    else:
        wanted = f"{'>' if above else '>='} {least:g}"
    try:
        ok = math.isfinite(value) and (value > least if above else value >= least)
        ok = ok and (below is None or value < below)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a finite number {wanted}, got {value!r}")
