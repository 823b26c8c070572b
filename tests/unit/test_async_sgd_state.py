"""async-sgd's server owns the update: the weights' version across a resume, and a worker's
rate that a user's loop changes (which the server never sees)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tether.config import TrainConfig
from tether.methods import METHODS, MethodContext, Placement
from tether.training.method_optimizer import MethodOptimizer


def _async_sgd(rank: int, **config: object) -> torch.nn.Module:
    transport = SimpleNamespace(rank=rank, world_size=3)  # the server and 2 workers
    context = MethodContext(
        TrainConfig(method="async-sgd", **config),  # type: ignore[arg-type]
        transport,  # type: ignore[arg-type]
        torch.device("cpu"),
        Placement(),
    )
    return METHODS.get("async-sgd")(torch.nn.Linear(2, 1), context)


def test_a_resumed_server_counts_staleness_from_the_restored_version() -> None:
    """Each worker's sent version stayed 0 while the version was restored (56): with a
    staleness bound every worker's first gradient after a resume read as 56 updates old and was
    dropped."""
    server = _async_sgd(0, staleness_bound=3)
    server.load_state_dict({**server.state_dict(), "version": 56})
    assert server.version == 56
    assert server.sent_version == {1: 56, 2: 56}


def test_a_rate_changed_in_a_workers_loop_is_said_to_change_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _async_sgd(1)
    monkeypatch.setattr(worker, "step", lambda backward, times: None)  # no server here
    optimizer = MethodOptimizer(worker)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    optimizer.step()
    assert "warning" not in capsys.readouterr().err
    schedule.step()  # the user's own scheduler, stepped in the loop: the server never sees it
    optimizer.step()
    said = capsys.readouterr().err
    assert "changes nothing" in said and "ctx.wrap(model, opt, scheduler)" in said
    schedule.step()
    optimizer.step()
    assert "warning" not in capsys.readouterr().err  # once
