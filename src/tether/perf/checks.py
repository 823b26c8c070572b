"""What every input of the performance model counts as a number: a profile file's fields, a
workload's, a prediction's settings and the Python API's arguments share these two definitions
(a bool is no number here, though Python counts it as an int; NumPy's numbers are)."""

from __future__ import annotations

import math
import numbers
from typing import Any


def is_whole(value: Any) -> bool:
    """An int or one of NumPy's integers, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A finite int or float (NumPy's included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
