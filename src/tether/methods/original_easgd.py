"""original-easgd: the center served in strict round-robin order by rank (Zhang et al. 2015).

The baseline of You, Buluc, Demmel (SC17): the master exchanges with worker 1, then 2, ..., then P,
then again; worker i+1's exchange cannot start before worker i's has finished, so one slow worker
stalls all the others. A dead worker stalls the rotation, so this method fails fast instead of
carrying on. The fixed order makes a run deterministic: the server checkpoints only at the end
of a round, where every worker has just applied its exchange and saves its own state too, so a
resume with the same workers continues bitwise.
"""

from __future__ import annotations

from tether.methods.default_rates import own_batch_rate
from tether.methods.elastic import ElasticServerMethod


class OriginalEASGD(ElasticServerMethod):
    """Default lr 0.4, tau 1: 85% test accuracy on LeNet-5 / Fashion-MNIST, 4 workers, in
    14.9-15.7 s (522 steps) against 14.7-16.3 s with tau 4 (638 steps) and 18.0-19.7 s at
    lr 0.2; 0.8 diverged (benchmarks/results/method_defaults_sweep.md).
    """

    name = "original-easgd"
    defaults = own_batch_rate(0.4)
    round_robin = True
    tolerates_worker_loss = False
    # Deterministic, so a resume can be bitwise: every worker checkpoints its own replica and
    # local optimizer at the round ends the server checkpoints at.
    per_rank_state = True
