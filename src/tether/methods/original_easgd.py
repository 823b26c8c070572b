"""original-easgd: the center served in strict round-robin order by rank (Zhang et al. 2015).

The baseline of You, Buluc, Demmel (SC17): the master exchanges with worker 1, then 2, ..., then P,
then again; worker i+1's exchange cannot start before worker i's has finished, so one slow worker
stalls all the others. A dead worker stalls the rotation, so this method fails fast instead of
carrying on.
"""

from __future__ import annotations

from tether.methods.elastic import ElasticServerMethod
from tether.methods.registry import METHODS


@METHODS.register("original-easgd", help="EASGD, center served round-robin by rank (baseline)")
class OriginalEASGD(ElasticServerMethod):
    name = "original-easgd"
    round_robin = True
    tolerates_worker_loss = False
