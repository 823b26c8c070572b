"""hogwild-sgd: lock-free SGD on weights shared in memory (Recht, Re, Wright, Niu, NIPS 2011).

All workers of the node map ONE weight vector, and each worker's model parameters are views into
it, so every forward pass reads the live shared weights. After its backward pass a worker applies
``w <- w - lr * (g + wd * w)`` to the shared vector in place, without any lock: updates of two
workers may interleave element by element, and a gradient may be computed on weights that another
worker changed during the forward pass. Recht et al. show that when updates are sparse enough
these collisions cost little, and taking no lock wins; SC17 (You, Buluc, Demmel) uses Hogwild SGD
as the baseline that Hogwild EASGD beats. Nothing crosses the wire while training: rank 0 creates
the shared weights, evaluates them and watches progress and worker liveness
(:mod:`tether.methods.hogwild_base`).

Across nodes: not available. Shared memory cannot span nodes, so when the launcher places ranks on
several nodes (LOCAL_WORLD_SIZE != WORLD_SIZE) the method refuses to start with a one-line error
that points to ``async-sgd``, the parameter-server method for that case (the server applies the
workers' gradients one at a time as they arrive).
"""

from __future__ import annotations

import torch
from torch import nn

from tether.errors import TetherError
from tether.methods.base import MethodContext, StepTimes
from tether.methods.flat import flatten_parameters
from tether.methods.hogwild_base import HogwildMethod, single_node
from tether.methods.local_step import loss_and_gradient
from tether.methods.ps_method import ServeResult, ServerHooks
from tether.methods.registry import METHODS


@METHODS.register("hogwild-sgd", help="lock-free SGD on weights in shared memory (one node)")
class HogwildSGD(HogwildMethod):
    """Default lr 0.05: 85% test accuracy on LeNet-5 / Fashion-MNIST, 4 workers, in 18-24 s, as
    fast as lr 0.1 on average (16-28 s: its lock-free races vary more) and further from
    divergence (0.2 diverged) (benchmarks/results/method_defaults_sweep.md).
    """

    name = "hogwild-sgd"
    defaults = {"lr": 0.05}
    shared_name = "weights"

    def __init__(self, model: nn.Module, context: MethodContext) -> None:
        super().__init__(model, context)
        if not single_node():
            raise TetherError(
                "hogwild-sgd needs every process on one node (its weights live in shared "
                "memory); across nodes use --method async-sgd"
            )
        self.require_cpu()

    def start(self, step: int = 0) -> None:
        shared = self.start_shared(step)
        if not self.is_server:
            # From here on the model computes with the live shared weights; the handshake's copy
            # of the initial weights is the same values and is not needed.
            self.flat = flatten_parameters(self.model, storage=shared)

    # -- worker ----------------------------------------------------------------------------------
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor, times: StepTimes) -> float:
        start = self.clock()
        loss, grad = loss_and_gradient(self.model, inputs, targets)
        if self.config.weight_decay:
            grad.add_(self.flat, alpha=self.config.weight_decay)
        # In place on the shared weights, no lock: this is the whole of Hogwild.
        self.flat.sub_(grad, alpha=self.config.lr)
        self.note_step()
        times.compute_s += self.clock() - start
        return loss

    # -- server ----------------------------------------------------------------------------------
    def serve(self, hooks: ServerHooks) -> ServeResult:
        self.watch(hooks, self.board_steps)
        return self.result(updates=sum(self.board_steps()), shared_memory=True)
