"""Optimizers and schedules: EAMSGD's look-ahead Nesterov step against its recursion, named
optimizers, and warm-up followed by each schedule."""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pytest
import torch

from tether.optim import (
    LAMB,
    LARS,
    LookaheadNesterov,
    NamedOptimizer,
    NamedSchedule,
    OptimizerSettings,
    ScheduleSettings,
    build_schedule,
    linear_scaling,
    needs_closure,
)
from tether.optim.schedule_resume import ScheduleStart, load_schedule_state

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
    with pytest.raises(Exception, match=r"valid optimizers: sgd, adam, adamw, lars, lamb, auto$"):
        NamedOptimizer("novograd", settings)


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_the_named_trust_ratio_optimizers_take_the_runs_exclusion_rule(name: str) -> None:
    layer = torch.nn.Linear(3, 2)
    default = NamedOptimizer(name, OptimizerSettings(lr=1.0))(layer.parameters())
    assert default.exclude(layer.bias) and not default.exclude(layer.weight)  # Jia et al.'s
    settings = OptimizerSettings(lr=1.0, trust_exclude="none")
    none = NamedOptimizer(name, settings)(layer.parameters())
    assert not none.exclude(layer.bias) and not none.exclude(layer.weight)


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


def test_a_warm_up_in_epochs_needs_the_steps_in_an_epoch() -> None:
    # without them it was taken as one step an epoch: no warm-up to speak of, without a word
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    warm = NamedSchedule("cosine", ScheduleSettings(warmup_epochs=1.0))
    with pytest.raises(ValueError, match="a warm-up of 1 epochs needs the steps in an epoch"):
        warm(opt, total_steps=100)
    sched = warm(opt, total_steps=100, steps_per_epoch=10)
    assert sched is not None and opt.param_groups[0]["lr"] == pytest.approx(0.1)  # 1 of 10


def test_a_resumed_schedule_keeps_its_position_and_takes_the_new_runs_length() -> None:
    def cosine(total: int) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = NamedSchedule("cosine", ScheduleSettings(warmup_steps=0))(opt, total_steps=total)
        assert sched is not None
        return opt, sched

    opt, sched = cosine(100)
    for _ in range(50):
        opt.step()
        sched.step()
    saved = sched.state_dict()
    longer, resumed = cosine(200)  # the run resumed with twice the epochs
    load_schedule_state(resumed, saved)
    assert resumed.last_epoch == 50
    for _ in range(100):  # to step 150 of 200: the old length would have ended the rate at 0
        longer.step()
        resumed.step()
    assert longer.param_groups[0]["lr"] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.75)))


def test_a_resume_that_lengthens_the_run_does_not_warm_up_again() -> None:
    # a warm-up of 1 epoch (20 steps) cut to a quarter of a 20-step run (5), resumed for 100
    # steps, was cut to 25 instead: at step 20 the rate went back into the warm-up (0.84)
    def built(total: int) -> tuple[torch.optim.Optimizer, Any]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        warm = NamedSchedule("cosine", ScheduleSettings(warmup_epochs=1.0))
        return opt, warm(opt, total_steps=total, steps_per_epoch=20)

    def resumed_rate(saved_at: int) -> float:
        """The rate of a 100-step run resumed from a 20-step one's schedule at ``saved_at``."""
        opt, sched = built(20)
        for _ in range(saved_at):
            opt.step()
            sched.step()
        longer, resumed = built(100)
        load_schedule_state(resumed, sched.state_dict())
        return float(longer.param_groups[0]["lr"])

    after_warmup = 0.5 * (1 + math.cos(math.pi * 15 / 95))  # 15 steps into a decay of 95
    assert resumed_rate(20) == pytest.approx(after_warmup)
    # one that had not finished its warm-up takes this run's (nothing is cut short)
    assert resumed_rate(3) == pytest.approx(4 / 20)


def _warm_poly(opt: torch.optim.Optimizer, total_steps: int) -> Any:
    """A user's own schedule factory that takes the run's length (torch's classes)."""
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=3)
    poly = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=total_steps - 3, power=2.0)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, poly], milestones=[3])


def _closure_poly(opt: torch.optim.Optimizer, total_steps: int) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (1 - s / total_steps) ** 2)


SCHEDULES_OF_A_RUN = {
    "named poly": lambda opt, total: NamedSchedule("poly", ScheduleSettings(warmup_steps=2))(
        opt, total_steps=total
    ),
    "own SequentialLR": _warm_poly,
    "own LambdaLR": _closure_poly,
}


def _rates_resumed(
    factory: Any, saved_at: int, saved_total: int, total: int, lr: float = 0.5
) -> list[float]:
    """The rates of steps ``saved_at`` to ``total`` of a run resumed from a checkpoint taken at
    ``saved_at`` of a run of ``saved_total`` steps at rate 0.5, restored as a method restores
    it (the optimizer's state, then the schedule's) into one built with ``lr``."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    sched = factory(opt, saved_total)
    for _ in range(saved_at):
        opt.step()
        sched.step()
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = factory(opt, total)
    start = ScheduleStart(sched)
    opt.load_state_dict(saved_opt)
    load_schedule_state(sched, saved_sched, start)
    rates = []
    for _ in range(saved_at, total):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


@pytest.mark.parametrize("name", sorted(SCHEDULES_OF_A_RUN))
def test_a_run_resumed_longer_steps_at_the_longer_runs_rates(name: str) -> None:
    # Before, the first step after the resume ran at the optimizer's saved rate, the old
    # length's (0 at its end), and a user's schedule kept the old length throughout.
    factory = SCHEDULES_OF_A_RUN[name]
    straight = _rates_resumed(factory, 0, 20, 20)[10:]
    resumed = _rates_resumed(factory, 10, 10, 20)
    assert resumed == pytest.approx(straight, rel=1e-12), (resumed, straight)
    assert resumed[0] > 0.1


@pytest.mark.parametrize("name", sorted(SCHEDULES_OF_A_RUN))
@pytest.mark.parametrize("total", [10, 20])
def test_a_resumed_run_keeps_the_saved_base_rate(name: str, total: int) -> None:
    # A parameter-server method resumed on another worker count builds its optimizer at another
    # default rate: the checkpoint's rate stays (found by review: a longer run took the new one).
    factory = SCHEDULES_OF_A_RUN[name]
    straight = _rates_resumed(factory, 0, total, total)[5:]
    assert _rates_resumed(factory, 5, 10, total, lr=0.25) == pytest.approx(straight, rel=1e-12)


@pytest.mark.parametrize("name", sorted(SCHEDULES_OF_A_RUN))
def test_a_run_resumed_as_long_takes_the_saved_rates_exactly(name: str) -> None:
    factory = SCHEDULES_OF_A_RUN[name]
    assert _rates_resumed(factory, 8, 20, 20) == _rates_resumed(factory, 0, 20, 20)[8:]


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def _train(net: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def test_lars_with_the_trust_ratio_forced_to_one_is_momentum_sgd_exactly() -> None:
    a, b = _net(), _net()
    lars = LARS(a.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3, trust_ratio=False,
                exclude=None)  # fmt: skip
    sgd = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    assert torch.equal(_train(a, lars), _train(b, sgd))


def test_lars_scales_each_layer_by_its_trust_ratio_and_spares_biases() -> None:
    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))  # ||w|| = 5
    bias = torch.nn.Parameter(torch.tensor([1.0]))
    w.grad, bias.grad = torch.tensor([[0.6, 0.8]]), torch.tensor([0.5])  # ||g|| = 1
    lr, wd, eta = 0.1, 0.01, 0.002
    LARS([w, bias], lr=lr, momentum=0.0, weight_decay=wd, eta=eta, eps=0.0).step()
    trust = eta * 5.0 / (1.0 + wd * 5.0)
    expected = torch.tensor([[3.0, 4.0]]) - lr * trust * (
        torch.tensor([[0.6, 0.8]]) + wd * torch.tensor([[3.0, 4.0]])
    )
    assert torch.allclose(w.detach(), expected, rtol=1e-6)
    assert torch.allclose(bias.detach(), torch.tensor([1.0 - lr * 0.5]))  # no ratio, no decay
    # LARC's clip mode: the local rate never exceeds the global one.
    v = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))
    v.grad = torch.tensor([[0.006, 0.008]])  # a tiny gradient: the ratio would exceed 1/lr
    LARS([v], lr=lr, momentum=0.0, eta=eta, eps=0.0, clip=True).step()
    assert torch.allclose(v.detach(), torch.tensor([[3.0, 4.0]]) - lr * v.grad)


@pytest.mark.parametrize("clip", [False, True])
def test_lars_gives_a_zero_initialised_layer_the_plain_step(clip: bool) -> None:
    # ||w|| = 0: the ratio is 1, not eta (a step 1000 times too small) nor the clip's
    # min(eta / lr, 1); as apex's LARC
    w = torch.nn.Parameter(torch.zeros(1, 2))
    w.grad = torch.tensor([[0.6, 0.8]])
    LARS([w], lr=0.1, momentum=0.0, weight_decay=0.01, clip=clip).step()
    assert torch.allclose(w.detach(), -0.1 * torch.tensor([[0.6, 0.8]]))


def test_lamb_with_the_ratio_forced_to_one_is_adamw() -> None:
    a, b = _net(), _net()
    lamb = LAMB(
        a.parameters(), lr=0.01, eps=1e-8, weight_decay=0.05, trust_ratio=False, exclude=None
    )
    adamw = torch.optim.AdamW(b.parameters(), lr=0.01, eps=1e-8, weight_decay=0.05)
    assert torch.allclose(_train(a, lamb), _train(b, adamw), rtol=1e-5, atol=1e-7)


def test_lamb_scales_the_adam_update_by_the_layer_trust_ratio() -> None:
    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))
    w.grad = torch.tensor([[1.0, -2.0]])
    LAMB([w], lr=0.1, eps=0.0, weight_decay=0.0).step()
    update = torch.tensor([[1.0, -1.0]])  # the first Adam step: sign(g)
    expected = torch.tensor([[3.0, 4.0]]) - 0.1 * (5.0 / update.norm()) * update
    assert torch.allclose(w.detach(), expected, rtol=1e-6)


@pytest.mark.parametrize("cls", [LARS, LAMB])
def test_trust_ratio_state_loads_safely(cls: type) -> None:
    net = _net()
    opt = cls(net.parameters(), lr=0.01)
    _train(net, opt, steps=2)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # no callable in the checkpoint
    again = cls(_net().parameters(), lr=0.01)
    again.load_state_dict(state)
    assert again.state_dict()["param_groups"] == opt.state_dict()["param_groups"]


@pytest.mark.parametrize("cls", [LARS, LAMB])
def test_what_the_trust_ratio_cannot_take_is_refused_in_one_line(cls: type) -> None:
    """A sparse gradient failed deep in the arithmetic (or, LARS without weight decay, passed);
    a complex parameter's ratio was taken from its real part alone (LAMB silently)."""
    embedding = torch.nn.Embedding(5, 3, sparse=True)
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match=f"{cls.__name__} does not support sparse gradients"):
        cls(embedding.parameters(), lr=0.01).step()
    z = torch.nn.Parameter(torch.randn(2, 2, dtype=torch.complex64))
    z.grad = torch.randn(2, 2, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match="does not support complex parameters"):
        cls([z], lr=0.01).step()
    # One value per message; NaN refused too (it passed every comparison, and eta=nan filled
    # the weights with NaN at the first step: found by a user).
    nan = float("nan")
    bad = [("weight_decay", -1.0, ">= 0"), ("eps", nan, ">= 0"), ("lr", nan, "> 0")]
    bad += [("weight_decay", nan, ">= 0"), ("lr", 0.0, "> 0")]
    bad += [("eta", nan, "> 0"), ("eta", -1, "> 0")] if cls is LARS else []
    for name, value, wanted in bad:
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number {wanted}, got"):
            cls(_net().parameters(), **{"lr": 0.01, name: value})


def test_the_look_ahead_step_refuses_a_nan_rate_too() -> None:
    with pytest.raises(ValueError, match=r"^momentum must be a finite number in \[0, 1\), got nan"):
        LookaheadNesterov(_net().parameters(), lr=0.1, momentum=float("nan"))


def test_poly_decay_warm_up_in_epochs_and_the_linear_scaling_rule() -> None:
    assert _rates("poly", 0, 4) == pytest.approx([1.0, 0.5625, 0.25, 0.0625])  # (1 - s/4)^2
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    settings = ScheduleSettings(warmup_epochs=0.5, power=1.0)
    for total, warmup in ((16, 4), (8, 2)):  # half an epoch of 8 steps, or a quarter of the run
        opt.param_groups[0]["lr"] = 1.0
        opt.param_groups[0].pop("initial_lr", None)
        sched = NamedSchedule("poly", settings)(opt, total_steps=total, steps_per_epoch=8)
        assert sched is not None
        rates = []
        for _ in range(total):
            rates.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        assert rates[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
        left = total - warmup
        assert rates[warmup:] == pytest.approx([1 - s / left for s in range(left)])
    assert linear_scaling(0.1, global_batch=8192, base_batch=256) == pytest.approx(3.2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # a ZeroDivisionError mid-run before (found by a user)
        ({"power": -1.0}, r"^power must be a finite number > 0, got -1.0$"),
        ({"warmup_steps": -2}, r"^warmup_steps must be a whole number >= 0, got -2$"),
        ({"total_steps": 2.5}, r"^total_steps must be a whole number >= 0, got 2.5$"),
        ({"decay": float("nan")}, r"^decay must be a finite number > 0, got nan$"),
    ],
)
def test_schedule_settings_no_schedule_can_follow_are_refused(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScheduleSettings(**change)


def test_schedule_settings_take_any_whole_number() -> None:
    # numpy's integers and whole floats were refused by the first check (found by review)
    whole: Any = 10.0  # a float where an int is typed: what a user's arithmetic gives
    settings = ScheduleSettings(total_steps=np.int64(1000), warmup_steps=whole)
    assert (settings.total_steps, settings.warmup_steps) == (1000, 10)
    assert type(settings.total_steps) is int
