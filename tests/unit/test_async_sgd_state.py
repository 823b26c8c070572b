"""async-sgd's server state across a resume: the weights' version and what each worker holds."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tether.config import TrainConfig
from tether.methods import METHODS, MethodContext, Placement


def test_a_resumed_server_counts_staleness_from_the_restored_version() -> None:
    """Each worker's sent version stayed 0 while the version was restored (56): with a
    staleness bound every worker's first gradient after a resume read as 56 updates old and was
    dropped."""
    transport = SimpleNamespace(rank=0, world_size=3)  # the server and 2 workers
    config = TrainConfig(method="async-sgd", staleness_bound=3)
    context = MethodContext(config, transport, torch.device("cpu"), Placement())  # type: ignore[arg-type]
    server = METHODS.get("async-sgd")(torch.nn.Linear(2, 1), context)
    server.load_state_dict({**server.state_dict(), "version": 56})
    assert server.version == 56
    assert server.sent_version == {1: 56, 2: 56}
