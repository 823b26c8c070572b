"""What an exchange costs in training beyond the idle links' price.

The links' alpha and beta are fitted to all-reduce between ranks that do nothing else (the
server's wire to round trips between two idle processes). In training the same ranks also
compute, and an exchange costs more in three ways (SC17 section 5 counts a method's
communication as what the workers wait for, not what the wire carries):

* each message of a collective costs ``alpha`` more: a rank blocked in the exchange is
  woken on a core that is busy with compute, and each of the ring's ``2(P-1)`` steps pays that
  wake-up; it is priced with the links (:class:`tether.perf.collective_cost.Links`'s
  ``a_load``);
* each exchange waits for the latest rank to arrive: the P ranks' steps end at different
  times. If a step's end varies like a normal variable of spread sigma, the wait behind the
  latest of P is ``sigma * m(P)``, ``m(P)`` the expected largest of P standard normals (Blom's
  approximation, 1958: ``Phi^-1((P - 0.375)/(P + 0.25))``). The profile measures the wait of
  two ranks (``skew``, on cores of their own), so ``skew(P) = skew * m(P)/m(2)``; on a node
  whose workers share cores the steps stretch with the time slicing and so does their spread:
  times the node's oversubscription;
* a parameter server spends ``server`` seconds more of a core per exchange than its apply is
  priced at (its Python loop, the copies in and out of the sockets, the checks of every
  message): CPU work, so it counts in the server's service time, in the share of a core it
  takes from the workers beside it and in its node's CPU bound (:mod:`tether.perf.predict`).

``tether calibrate`` fits the first two from two short sync-sgd runs without overlap, one message
per tensor and fused, and the third from a short async-sgd run
(:mod:`tether.bench.exchange_load`).
"""

from __future__ import annotations

from statistics import NormalDist

from tether.perf.profile import HardwareProfile

_STANDARD = NormalDist()


def expected_latest(ranks: int) -> float:
    """``m(P)``: the expected largest of ``ranks`` standard normal variables (Blom); 0 for one."""
    if ranks <= 1:
        return 0.0
    return _STANDARD.inv_cdf((ranks - 0.375) / (ranks + 0.25))


def alpha_load(profile: HardwareProfile) -> float:
    """Seconds more per message of a collective in training (0 where not measured)."""
    return profile.exchange_load.alpha.value if profile.exchange_load is not None else 0.0


def server_load(profile: HardwareProfile) -> float:
    """Seconds more of a parameter server's CPU per exchange (0 where not measured)."""
    return profile.exchange_load.server.value if profile.exchange_load is not None else 0.0


def exchange_skew_s(profile: HardwareProfile, ranks: int, oversubscription: float) -> float:
    """Seconds one exchange among ``ranks`` waits for the latest of them (0 where the profile
    did not measure it); ``oversubscription`` >= 1 is how much the node's shared cores stretch
    a step."""
    if profile.exchange_load is None or ranks <= 1:
        return 0.0
    scale = expected_latest(ranks) / expected_latest(2)
    return profile.exchange_load.skew.value * scale * max(1.0, oversubscription)
