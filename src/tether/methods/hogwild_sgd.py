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

from typing import Any

import torch
from torch import nn

from tether.errors import TetherError
from tether.methods.base import Backward, StepTimes
from tether.methods.default_rates import own_batch_rate
from tether.methods.flat import flatten_parameters
from tether.methods.hogwild_base import HogwildMethod, single_node
from tether.methods.ps_method import ServeResult, ServerHooks


class HogwildSGD(HogwildMethod):
    """Default lr 0.05: 85% test accuracy on LeNet-5 / Fashion-MNIST, 4 workers, in 18-24 s, as
    fast as lr 0.1 on average (16-28 s: its lock-free races vary more) and further from
    divergence (0.2 diverged) (benchmarks/results/method_defaults_sweep.md).
    """

    name = "hogwild-sgd"
    defaults = own_batch_rate(0.05)
    shared_name = "weights"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not single_node(self.context):
            raise TetherError(
                "hogwild-sgd needs every process on one node (its weights live in shared "
                "memory); across nodes use --method async-sgd"
            )
        self.require_cpu()

    def start(self, step: int = 0) -> None:
        shared = self.start_shared(step)
        if not self.is_server:
            # From here on the model computes with the live shared weights; the handshake's copy
            # of the initial weights is the same values and is not needed. The optimizer holds
            # the same Parameter objects, so its steps now write the shared vector.
            self.flat = flatten_parameters(self.model, storage=shared)

    # -- worker ----------------------------------------------------------------------------------
    def step(self, backward: Backward, times: StepTimes) -> torch.Tensor | None:
        # The optimizer's step writes the shared weights in place, with no lock: this is the
        # whole of Hogwild (plain SGD by default: w <- w - lr * (g + wd * w)).
        loss = self.local_update(backward, times)
        self.note_step()
        return loss

    def eval_model(self) -> nn.Module:
        return self.model  # every process's model reads the live shared weights

    # -- server ----------------------------------------------------------------------------------
    def serve(self, hooks: ServerHooks) -> ServeResult:
        self.watch(hooks, self.board_steps)
        return self.result(updates=sum(self.board_steps()), shared_memory=True)
