"""async-measgd: async-easgd whose workers take Nesterov momentum local steps (EAMSGD).

Worker step (Zhang et al. 2015, Algorithm 2): ``v <- mu*v - lr*g(x + mu*v)``, ``x <- x + v``, with
``mu`` from ``--momentum`` (:class:`~tether.optim.LookaheadNesterov`); the elastic exchange and
the server are those of async-easgd. With a user's own optimizer it is async-easgd with that
optimizer.
"""

from __future__ import annotations

from tether.methods.default_rates import own_batch_rate
from tether.methods.elastic import ELASTIC_SETTINGS, ElasticServerMethod


class AsyncMEASGD(ElasticServerMethod):
    """Default lr 0.05, tau 4 (momentum 0.9): fastest to 85% test accuracy on LeNet-5 /
    Fashion-MNIST, 4 workers, 7.2-7.8 s against 8.5-9.9 s at lr 0.1 and 9.9-10.7 s with tau 1
    (benchmarks/results/method_defaults_sweep.md).
    """

    name = "async-measgd"
    defaults = {**own_batch_rate(0.05), "tau": 4}
    local_step_name = "lookahead-nesterov"
    settings = ELASTIC_SETTINGS | {"momentum"}
