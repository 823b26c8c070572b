"""async-easgd: the center served first come, first served, updates serialized (SC17, Alg. 2).

The server receives from whichever worker is ready (receive from any source) and applies the
elastic update of each arrival in turn; no worker waits for another's computation.
"""

from __future__ import annotations

from tether.methods.default_rates import own_batch_rate
from tether.methods.elastic import ElasticServerMethod


class AsyncEASGD(ElasticServerMethod):
    """Default lr 0.4, tau 4: fastest to 85% test accuracy on LeNet-5 / Fashion-MNIST, 4 workers,
    11.8-13.4 s against 14.3-16.7 s with tau 1 and 19.4-19.5 s at lr 0.2; 0.8 diverged
    (benchmarks/results/method_defaults_sweep.md).
    """

    name = "async-easgd"
    defaults = {**own_batch_rate(0.4), "tau": 4}
