"""async-easgd: the center served first come, first served, updates serialized (SC17, Alg. 2).

The server receives from whichever worker is ready (receive from any source) and applies the
elastic update of each arrival in turn; no worker waits for another's computation.
"""

from __future__ import annotations

from tether.methods.elastic import ElasticServerMethod
from tether.methods.registry import METHODS


@METHODS.register("async-easgd", help="EASGD, first-come-first-served server, serialized updates")
class AsyncEASGD(ElasticServerMethod):
    name = "async-easgd"
