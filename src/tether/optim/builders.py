"""The optimizers a user picks by name (``--optimizer``), and the local steps methods default to.

Every method's local update is a ``torch.optim.Optimizer`` step (the one step seam), so the
optimizers here are torch's own, built from the run's settings; the one of our own is EAMSGD's
look-ahead Nesterov step (:mod:`tether.optim.lookahead_nesterov`). A user's own optimizer comes
as a factory ``params -> Optimizer`` instead (``tether.fit(optimizer=...)``, or an import path on
the command line).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from tether.config import TrainConfig
from tether.errors import TetherError
from tether.optim.lamb import LAMB
from tether.optim.lars import LARS
from tether.optim.lookahead_nesterov import LookaheadNesterov
from tether.optim.trust import EXCLUSIONS
from tether.registry import Registry

Params = Iterable[torch.Tensor]


@dataclass(frozen=True)
class OptimizerSettings:
    """The run's optimizer settings (config keys of the same names)."""

    lr: float
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    lars_eta: float = 0.001
    trust_exclude: str = "bias-norm"  # LARS's and LAMB's exclusion rule (trust.EXCLUSIONS)

    @staticmethod
    def of(config: TrainConfig) -> OptimizerSettings:
        return OptimizerSettings(
            lr=config.scaled_lr,
            momentum=config.momentum,
            nesterov=config.nesterov,
            weight_decay=config.weight_decay,
            lars_eta=config.lars_eta,
            trust_exclude=config.trust_exclude,
        )


OptimizerBuilder = Callable[[Params, OptimizerSettings], torch.optim.Optimizer]


def sgd(params: Params, s: OptimizerSettings) -> torch.optim.Optimizer:
    """SGD with the run's momentum (heavy ball, or Nesterov with ``nesterov``) and weight decay."""
    return torch.optim.SGD(
        params,
        lr=s.lr,
        momentum=s.momentum,
        nesterov=s.nesterov and s.momentum > 0,
        weight_decay=s.weight_decay,
    )


def plain_sgd(params: Params, s: OptimizerSettings) -> torch.optim.Optimizer:
    """``x <- x - lr * (g + wd * x)``: the local step of the EASGD workers (Zhang et al. 2015,
    Algorithm 1) and of Hogwild SGD; momentum is not used."""
    return torch.optim.SGD(params, lr=s.lr, momentum=0.0, weight_decay=s.weight_decay)


def lookahead_nesterov(params: Params, s: OptimizerSettings) -> torch.optim.Optimizer:
    """EAMSGD's local step: Nesterov momentum with the gradient at ``x + momentum * v``."""
    return LookaheadNesterov(params, lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay)


def adam(params: Params, s: OptimizerSettings) -> torch.optim.Optimizer:
    """Adam (L2 weight decay added to the gradient)."""
    return torch.optim.Adam(params, lr=s.lr, weight_decay=s.weight_decay)


def adamw(params: Params, s: OptimizerSettings) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay)."""
    return torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay)


def lars(params: Params, s: OptimizerSettings) -> torch.optim.Optimizer:
    """LARS with the run's momentum, weight decay, trust coefficient (``lars_eta``) and
    exclusion rule (``trust_exclude``)."""
    return LARS(
        params,
        lr=s.lr,
        momentum=s.momentum,
        weight_decay=s.weight_decay,
        eta=s.lars_eta,
        exclude=EXCLUSIONS[s.trust_exclude],
    )


def lamb(params: Params, s: OptimizerSettings) -> torch.optim.Optimizer:
    """LAMB with the run's weight decay and exclusion rule (``trust_exclude``)."""
    return LAMB(params, lr=s.lr, weight_decay=s.weight_decay, exclude=EXCLUSIONS[s.trust_exclude])


OPTIMIZERS: Registry[OptimizerBuilder] = Registry("optimizer", also=("auto",))
# The local steps methods use when the user names no optimizer (``TrainingMethod.local_step_name``).
LOCAL_STEPS: dict[str, OptimizerBuilder] = {
    "sgd": sgd,
    "plain-sgd": plain_sgd,
    "lookahead-nesterov": lookahead_nesterov,
}
OPTIMIZERS.register("sgd", help="SGD with --momentum (and nesterov=true), --weight-decay")(sgd)
OPTIMIZERS.register("adam", help="Adam, --weight-decay as L2")(adam)
OPTIMIZERS.register("adamw", help="AdamW, decoupled --weight-decay")(adamw)
OPTIMIZERS.register("lars", help="LARS: momentum SGD with a per-layer trust ratio (lars_eta)")(lars)
OPTIMIZERS.register("lamb", help="LAMB: AdamW with a per-layer trust ratio")(lamb)


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` must be given a closure that computes the gradient (our
    look-ahead Nesterov: it evaluates the loss once, at a point of its choosing)."""
    return bool(getattr(optimizer, "requires_closure", False))


def check_distributable(optimizer: object) -> None:
    """A one-line error for an optimizer no distributed method can follow: LBFGS evaluates the
    loss a data-dependent number of times per step, so ranks would issue different numbers of
    collectives (and hang)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise TetherError(
            "LBFGS calls its closure a data-dependent number of times per step, which the ranks "
            "of a distributed method cannot follow: use a first-order optimizer"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TetherError(
            f"the optimizer is a {type(optimizer).__name__}, not a torch.optim.Optimizer"
        )


class NamedOptimizer:
    """A factory ``params -> Optimizer`` for a registered name and the run's settings (an object,
    not a closure, so it pickles to worker processes)."""

    def __init__(self, name: str, settings: OptimizerSettings) -> None:
        OPTIMIZERS.get(name)  # an unknown name fails here, listing the valid ones
        self.name, self.settings = name, settings

    def __call__(self, params: Params) -> torch.optim.Optimizer:
        return OPTIMIZERS.get(self.name)(params, self.settings)

    def __repr__(self) -> str:
        return f"NamedOptimizer({self.name!r}, {self.settings})"
