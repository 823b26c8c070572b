"""What a prediction prices: the method and its communication settings (:class:`Setup`, as
``tether train`` takes them), and their check. The check is its own step so that ``tether
predict`` can run it on the options as given, naming them as the user typed them, before it builds
and times a model (seconds to minutes) only to refuse a setting at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.errors import TetherError
from tether.perf.checks import is_finite_number, is_whole
from tether.perf.collective_cost import ALL_REDUCE_ALGORITHMS
from tether.spelling import Spell, as_keyword

COLLECTIVE_METHODS = ("sync-sgd", "sync-easgd", "local-sgd", "two-level-easgd")
SERVER_METHODS = (
    "original-easgd",
    "async-sgd",
    "async-msgd",
    "async-easgd",
    "async-measgd",
    "hogwild-sgd",
    "hogwild-easgd",
)
PREDICTED_METHODS = COLLECTIVE_METHODS + SERVER_METHODS
# the methods that exchange after every step: a period (tau) does not apply to them (an
# async-sgd or async-msgd worker pushes its averaged gradients every tau steps)
EVERY_STEP_METHODS = ("sync-sgd", "hogwild-sgd")
# what a simulation takes where not told (tether simulate and tether.simulate alike): 1000
# exchanges per worker of 10 ms steps, a 0.5 ms message each way, 0.1 ms of the server's work
SIMULATED_ROUNDS, SIMULATED_STEP_S, SIMULATED_MESSAGE_S, SIMULATED_SERVICE_S = (
    1000,
    0.01,
    5e-4,
    1e-4,
)
# what --allreduce may name: the run's own choices ("native": the backend's; "auto": the fastest
# for each size, priced as the model's fastest) and every schedule the model prices
PRICED_ALL_REDUCES = ("native", "auto", *ALL_REDUCE_ALGORITHMS)
# each whole-number setting, its least value and what that least value means (where it is not
# the obvious one)
_COUNTS = (
    ("workers", 1, ""),
    ("tau", 1, ""),
    ("ranks_per_node", 0, " (0: the profile's)"),
    # a worker prices whole cores: 0 would be a worker that uses none (tether train's "divide
    # the cores" is not priced, since a prediction's node has no cores of its own to divide)
    ("threads_per_worker", 1, ""),
)


@dataclass(frozen=True)
class Setup:
    """What runs: the method and its communication settings (as ``tether train`` takes them)."""

    method: str
    workers: int
    tau: int = 1
    bucket_mb: float = 1.0  # 0: one message per tensor
    overlap: bool = True
    allreduce: str = "native"
    ranks_per_node: int = 0  # 0: the profile's
    threads_per_worker: int = 1

    def check(self, spell: Spell = as_keyword) -> Setup:
        """A one-line TetherError for a setting no run could take; ``spell`` names the settings
        as the caller writes them (``--bucket-mb`` on the command line, ``bucket_mb`` in
        Python). Returns the setup, checked."""

        if self.method not in PREDICTED_METHODS:
            raise TetherError(
                f"no prediction for method '{self.method}': one of {', '.join(PREDICTED_METHODS)}"
            )
        for name, least, meaning in _COUNTS:
            value = getattr(self, name)
            if not is_whole(value):
                raise TetherError(f"{spell(name)} must be a whole number, got {value!r}")
            if value < least:
                raise TetherError(f"{spell(name)} must be >= {least}{meaning}, got {value}")
        mb = self.bucket_mb
        if not (is_finite_number(mb) and mb >= 0):
            raise TetherError(
                f"{spell('bucket_mb')} must be >= 0 and finite (MiB; 0: one message per "
                f"tensor), got {mb!r}"
            )
        if self.allreduce not in PRICED_ALL_REDUCES:
            raise TetherError(
                f"unknown all-reduce {self.allreduce!r}: one of {', '.join(PRICED_ALL_REDUCES)}"
            )
        return self

    def check_one_node(
        self, profile_name: str, profile_ranks_per_node: int, spell: Spell = as_keyword
    ) -> None:
        """A method held to one node's memory (hogwild-sgd) at more workers than the node has
        ranks: a one-line TetherError, the settings spelled as in :meth:`check`."""
        limit = one_node_limit(self.method, profile_ranks_per_node, self.ranks_per_node)
        if limit is not None and self.workers > limit:
            raise TetherError(
                f"{self.method} shares its weights in one node's memory: at most {limit} workers "
                f"on {profile_name} ({limit} ranks per node, {spell('ranks_per_node')}), got "
                f"{spell('workers', self.workers)}; across nodes, async-sgd or hogwild-easgd"
            )


def one_node_limit(method: str, profile_ranks_per_node: int, ranks_per_node: int = 0) -> int | None:
    """The most workers ``method`` runs on (its weights in one node's shared memory: the
    profile's ranks per node), None where it has no such limit."""
    return (ranks_per_node or profile_ranks_per_node) if method == "hogwild-sgd" else None
