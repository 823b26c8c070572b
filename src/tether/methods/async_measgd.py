"""async-measgd: async-easgd whose workers take Nesterov momentum local steps (EAMSGD).

Worker step (Zhang et al. 2015, Algorithm 2): ``v <- mu*v - lr*g(x + mu*v)``, ``x <- x + v``, with
``mu`` from ``--momentum``; the elastic exchange and the server are those of async-easgd.
"""

from __future__ import annotations

from tether.methods.elastic import ElasticServerMethod
from tether.methods.registry import METHODS


@METHODS.register("async-measgd", help="async EASGD with Nesterov momentum on the workers")
class AsyncMEASGD(ElasticServerMethod):
    name = "async-measgd"
    local_momentum = True
