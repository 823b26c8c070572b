"""Targets: a test metric and the threshold that counts as reached (``accuracy>=0.88``,
``loss<=0.3``), which a run times (time to target) and may stop at."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tether.errors import TetherError


@dataclass(frozen=True)
class Target:
    """A test-metric threshold: reached when ``metric >= value`` (``above``) or ``<= value``."""

    metric: str
    above: bool
    value: float

    def reached(self, value: float) -> bool:
        return value >= self.value if self.above else value <= self.value

    def __str__(self) -> str:
        return f"{self.metric}{'>=' if self.above else '<='}{self.value:g}"


# Metrics where lower is better, when a target gives no direction.
_LOWER_IS_BETTER = re.compile(r"(loss|error|mse|mae|rmse|perplexity)$")
_TARGET = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$")


def parse_target(text: str) -> Target:
    """``"accuracy>=0.88"`` or ``"loss<=0.3"`` (``>``/``<`` mean the same) into a Target."""
    match = _TARGET.match(text)
    value = None
    if match:
        try:
            value = float(match.group(3))
        except ValueError:
            value = None
    if match is None or value is None:
        raise TetherError(
            f"target must look like 'accuracy>=0.88' or 'loss<=0.3' (a metric, >= or <=, a "
            f"number), got {text!r}"
        )
    return Target(match.group(1), match.group(2).startswith(">"), value)


def target_text(metric: str, value: float, above: bool | None = None) -> str:
    """The ``target`` string for a metric and threshold; the direction, when not given, is
    "lower is better" for losses and errors and "higher" otherwise."""
    if above is None:
        above = _LOWER_IS_BETTER.search(metric) is None
    return str(Target(metric, above, float(value)))
