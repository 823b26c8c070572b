"""Optimizers and schedules: EAMSGD's look-ahead Nesterov step against its recursion, named
optimizers, and warm-up followed by each schedule."""

from __future__ import annotations

import math

import pytest
import torch

from tether.optim import (
    LookaheadNesterov,
    NamedOptimizer,
    NamedSchedule,
    OptimizerSettings,
    ScheduleSettings,
    build_schedule,
    needs_closure,
)

A = torch.tensor([[3.0, 0.5], [0.5, 1.0]])


def _quadratic_grad(x: torch.Tensor) -> torch.Tensor:
    return A @ x  # gradient of 0.5 x^T A x


def test_lookahead_nesterov_follows_eamsgd_recursion() -> None:
    """v <- mu*v - lr*g(x + mu*v); x <- x + v (Zhang et al. 2015, Algorithm 2), weight decay at x."""
    lr, mu, wd = 0.1, 0.9, 0.01
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = LookaheadNesterov([p], lr=lr, momentum=mu, weight_decay=wd)
    x, v = p.detach().clone(), torch.zeros(2)
    seen = []

    def closure() -> torch.Tensor:
        seen.append(p.detach().clone())
        p.grad = _quadratic_grad(p.detach())
        return torch.tensor(0.0)

    for _ in range(5):
        opt.step(closure)
        g = _quadratic_grad(x + mu * v) + wd * x
        assert torch.allclose(seen[-1], x + mu * v)  # the gradient was taken at the look-ahead
        v = mu * v - lr * g
        x = x + v
        assert torch.allclose(p.detach(), x, atol=1e-6)
    assert needs_closure(opt) and not needs_closure(torch.optim.SGD([p], lr=0.1))
    with pytest.raises(RuntimeError, match="needs a closure"):
        opt.step()


def test_named_optimizers_use_the_run_settings() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    settings = OptimizerSettings(lr=0.3, momentum=0.8, nesterov=True, weight_decay=0.01)
    sgd = NamedOptimizer("sgd", settings)([p])
    group = sgd.param_groups[0]
    assert isinstance(sgd, torch.optim.SGD)
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.3, 0.8, True)
    adamw = NamedOptimizer("adamw", settings)([p])
    assert isinstance(adamw, torch.optim.AdamW) and adamw.param_groups[0]["weight_decay"] == 0.01
    with pytest.raises(Exception, match="valid optimizers: sgd, adam, adamw"):
        NamedOptimizer("lamb", settings)


def _rates(name: str, warmup: int, total: int, **kw: float) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = build_schedule(name, opt, ScheduleSettings(total, warmup, **kw))  # type: ignore[arg-type]
    rates = []
    for _ in range(total):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched is not None:
            sched.step()
    return rates


def test_warmup_then_each_schedule() -> None:
    assert _rates("constant", 0, 4) == [1.0] * 4
    assert _rates("constant", 4, 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    cosine = _rates("cosine", 2, 10)
    assert cosine[:2] == pytest.approx([0.5, 1.0])
    assert cosine[2:] == pytest.approx([0.5 * (1 + math.cos(math.pi * s / 8)) for s in range(8)])
    step = _rates("step", 0, 6, decay_every=2, decay=0.5)
    assert step == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.25, 0.25])


def test_a_named_schedule_gets_the_run_length() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = NamedSchedule("cosine", ScheduleSettings(warmup_steps=0))(opt, total_steps=4)
    assert sched is not None
    for _ in range(4):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    assert NamedSchedule("constant", ScheduleSettings())(opt, total_steps=4) is None
