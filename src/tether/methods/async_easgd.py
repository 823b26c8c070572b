"""async-easgd: the center served first come, first served, updates serialized (SC17, Alg. 2).

The server receives from whichever worker is ready (receive from any source) and applies the
elastic update of each arrival in turn; no worker waits for another's computation.
"""

from __future__ import annotations

from tether.methods.default_rates import own_batch_rate
from tether.methods.elastic import ElasticServerMethod


class AsyncEASGD(ElasticServerMethod):
    """Default lr 0.3, tau 4. On 4 workers 0.4 was fastest to 85% test accuracy on LeNet-5 /
    Fashion-MNIST (11.8-13.4 s, against 19.4-19.5 s at 0.2; 0.8 diverged:
    benchmarks/results/method_defaults_sweep.md), but it diverged on 1 and on 8 workers; 0.3
    reaches 85% on 1 and 4 workers in 2.0 and 2.48 epochs and trains on 8
    (benchmarks/results/defaults_sweep_amd-epyc-2cores.md).
    """

    name = "async-easgd"
    defaults = {**own_batch_rate(0.3), "tau": 4}
