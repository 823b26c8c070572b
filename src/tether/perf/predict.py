"""Predicted iteration time of every training method, with its breakdown, from a hardware profile
and a model's workload.

One iteration is one local step of one worker (forward, backward, update) plus its share of the
method's communication:

* ``sync-sgd``: the DAG model (:mod:`tether.perf.dag`) with the fusion buckets as configured,
  wait-free backprop when overlapping, else naive; MG-WFBP's merging and the best ``--bucket-mb``
  as recommendations;
* ``sync-easgd``: one all-reduce of the whole model every ``tau`` steps, hidden under the next
  ``tau`` steps' compute when overlapping (SC17's co-design 4), plus the elastic update (three
  passes over the weights); ``local-sgd``: the same all-reduce, not overlapped;
* ``two-level-easgd``: sync-sgd's buckets inside a node, and every ``tau`` steps a cross-node
  all-reduce of 1/G of the model per rank;
* the parameter-server methods and ``original-easgd``: the steady state of the closed system of
  P workers and one server (:func:`tether.perf.simulator.closed_form_throughput`): a push and a
  reply per exchange, the server serving one exchange at a time (round-robin by rank for
  original-easgd, first come first served for the async ones, no queue for Hogwild).

Workers that share a node's cores compute slower in proportion (``cores_per_node``; a parameter
server takes the share of a core it is busy, its utilisation), and on an oversubscribed node
nothing overlaps: the cores that would hide the communication are busy. Workers on cores of
their own still slow each other by what the cores share, where the profile measured it
(``busy_node_slowdown``). A server method's rate is also bounded by the CPU work its node must
do per step (compute, the server's apply, both ends of every loopback message) over the node's
cores, and, for workers on other nodes than the server's, by the server node's one link, which
carries every exchange's model in and out. ``hogwild-sgd`` shares one node's memory: no
prediction beyond a node's ranks. Where the profile measured the exchange in training
(:mod:`tether.perf.exchange_load`), a collective's every message costs that much more, every
exchange waits for the latest rank, and a server's service includes its measured CPU per
exchange.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tether.perf import dag
from tether.perf.collective_cost import (
    Links,
    all_reduce_time,
    message_time,
)
from tether.perf.exchange_load import alpha_load, exchange_skew_s, server_load
from tether.perf.profile import HardwareProfile
from tether.perf.run_setup import COLLECTIVE_METHODS, EVERY_STEP_METHODS, SERVER_METHODS, Setup
from tether.perf.simulator import SimulationConfig, WorkerSpeeds, closed_form_throughput
from tether.perf.workload import StepTimes, Workload

MIB = 1 << 20
BUCKET_CANDIDATES_MB = (0.0, 0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


@dataclass(frozen=True)
class Prediction:
    """Seconds per local step of one worker, and how they divide: ``iteration_s = compute_s +
    exposed_comm_s``, where ``compute_s`` is the step's forward, backward and update
    (``update_s`` is its part of it: the command line prints the two apart)."""

    method: str
    workers: int
    batch_size: int
    iteration_s: float
    compute_s: float
    exposed_comm_s: float
    update_s: float
    comm_s: float  # all communication per step, hidden or not
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.workers * self.batch_size / self.iteration_s if self.iteration_s else 0.0

    @property
    def comm_share(self) -> float:
        """Exposed communication as a share of the iteration (SC17's "communication share")."""
        return self.exposed_comm_s / self.iteration_s if self.iteration_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "workers": self.workers,
            "batch_size": self.batch_size,
            "iteration_s": self.iteration_s,
            "compute_s": self.compute_s,
            "exposed_comm_s": self.exposed_comm_s,
            "update_s": self.update_s,
            "comm_s": self.comm_s,
            "comm_share": self.comm_share,
            "samples_per_s": self.samples_per_s,
            **self.details,
        }


def links_of(profile: HardwareProfile, ranks_per_node: int = 0) -> Links:
    return Links(
        a=profile.intra.alpha.value,
        b=profile.intra.beta.value,
        g=profile.gamma.value,
        inter_a=profile.inter.alpha.value,
        inter_b=profile.inter.beta.value,
        ranks_per_node=ranks_per_node or profile.ranks_per_node,
        server_wire=(
            (profile.server_wire.alpha.value, profile.server_wire.beta.value)
            if profile.server_wire is not None
            else None
        ),
        a_load=alpha_load(profile),
        service_load=server_load(profile),
    )


def _slowdown(profile: HardwareProfile, setup: Setup, links: Links, server_share: float) -> float:
    """How much slower a worker computes when the node's workers (and ``server_share`` of a
    core for a parameter server) want more cores than the node has."""
    if profile.cores_per_node <= 0:
        return 1.0
    busy = min(setup.workers, links.ranks_per_node) * setup.threads_per_worker + server_share
    return max(1.0, busy / profile.cores_per_node)


def _neighbour_slowdown(profile: HardwareProfile, setup: Setup, links: Links) -> float:
    """How much slower a worker computes because workers on the node's other cores compete for
    what the cores share (caches, memory bandwidth, clocks): the profile's measured
    ``busy_node_slowdown`` when every core runs a worker, in proportion to the other cores in
    use before that (a parameter server's part of a core is left out: it is busy for short
    spells). 1 where the profile did not measure it."""
    cores = profile.cores_per_node
    if profile.busy_node_slowdown is None or cores <= setup.threads_per_worker:
        return 1.0
    on_node = min(setup.workers, links.ranks_per_node) * setup.threads_per_worker
    others = min(on_node, cores) - setup.threads_per_worker
    fraction = others / (cores - setup.threads_per_worker)
    return 1.0 + (profile.busy_node_slowdown.value - 1.0) * max(0.0, fraction)


def _sync_sgd(
    steps: StepTimes, setup: Setup, links: Links, overlap: bool, skew_s: float = 0.0
) -> dict[str, Any]:
    """The DAG model of a step; every step's exchange also waits ``skew_s`` for the latest rank
    (:mod:`tether.perf.exchange_load`), which nothing hides."""
    p = setup.workers

    def comm(n: float) -> float:
        return all_reduce_time(setup.allreduce, p, n, links)

    t_f = steps.data_s + sum(steps.forward_s)

    def iteration(bucket_mb: float, overlapped: bool) -> dag.Iteration:
        t_c = dag.bucket_comm(steps.tensor_bytes, bucket_mb * MIB if bucket_mb else None, comm)
        model = dag.wfbp if overlapped else dag.naive
        return _waiting(model(t_f, steps.backward_s, t_c, steps.update_s), skew_s)

    chosen = iteration(setup.bucket_mb, overlap)
    best_mb, best_s = _best_bucket(setup, steps, comm, lambda mb: iteration(mb, overlap).total_s)
    # MG-WFBP's start-up is the all-reduce's (its fixed cost per message: 2(P-1) latencies on a
    # ring), not one point-to-point latency: at thousands of workers the latter kept layers apart
    # whose separate all-reduces cost more than the overlap they kept.
    start_up = comm(1.0)
    merged = dag.mg_wfbp(t_f, steps.backward_s, steps.layer_bytes, steps.update_s, comm, start_up)
    return {
        "iteration": chosen,
        "naive_s": iteration(setup.bucket_mb, False).total_s,
        "wfbp_s": iteration(setup.bucket_mb, True).total_s,
        "mg_wfbp_s": merged.iteration.total_s + skew_s,
        # messages that carry something (a layer without parameters is a group of its own)
        "mg_wfbp_messages": sum(
            1 for group in merged.groups if sum(steps.layer_bytes[i] for i in group) > 0
        ),
        "recommended_bucket_mb": best_mb,
        "recommended_s": best_s,
    }


def _best_bucket(
    setup: Setup, steps: StepTimes, comm: dag.CommTime, total_s: Callable[[float], float]
) -> tuple[float | None, float | None]:
    """The ``--bucket-mb`` of the fastest predicted iteration, and its time. Candidates the
    model cannot tell apart (within a part in a billion) are a tie, and a tie keeps the setting
    as it is, or else takes the candidate nearest it: a recommendation must be a change the
    model says is faster, not the smallest of equals. None where nothing is communicated (one
    worker): no bucket size changes anything."""
    if setup.workers <= 1 or comm(float(steps.model_bytes)) <= 0:
        return None, None
    sweep = {mb: total_s(mb) for mb in (*BUCKET_CANDIDATES_MB, setup.bucket_mb)}
    fastest = min(sweep.values())
    tied = [mb for mb, t in sweep.items() if t <= fastest * (1 + 1e-9)]
    best = min(tied, key=lambda mb: (abs(mb - setup.bucket_mb), mb))
    return best, sweep[best]


def _waiting(it: dag.Iteration, skew_s: float) -> dag.Iteration:
    return dag.Iteration(it.total_s + skew_s, it.compute_s, it.comm_s + skew_s)


def _rounds(
    steps: StepTimes, setup: Setup, links: Links, overlap: bool, skew_s: float = 0.0
) -> dag.Iteration:
    """sync-easgd, local-sgd, two-level-easgd: local steps with a round every tau steps; each
    round also waits ``skew_s`` for the latest rank (two-level-easgd: inside the node every
    step, as sync-sgd)."""
    n = steps.model_bytes
    compute = step_s = steps.compute_s  # step_s: a local step, what a round hides under
    if setup.method == "two-level-easgd":
        inside = _sync_sgd(steps, _node_setup(setup, links), links, overlap, skew_s)["iteration"]
        per_node = min(setup.workers, links.ranks_per_node)
        nodes = links.nodes(setup.workers)
        # the G local ranks each all-reduce 1/G of the model across the nodes at once, sharing
        # the node's link: the bytes of one whole-model all-reduce over N, its start-ups in
        # parallel; then the node all-gathers the G pieces (a ring all-gather inside the node)
        node_link = replace(links, a=links.inter_a, b=links.inter_b, ranks_per_node=1)
        round_s = all_reduce_time(setup.allreduce, nodes, n, node_link)
        round_s += (per_node - 1) * (links.a + n / per_node * links.b) + 3 * n * links.g
        # a local step is the node's sync-sgd step: its exposed all-reduce is communication
        step_s, base_comm = inside.total_s, inside.comm_s
    else:
        round_s = all_reduce_time(setup.allreduce, setup.workers, n, links)
        base_comm = 0.0
        if setup.method == "sync-easgd":
            round_s += 3 * n * links.g  # d = x - c, x -= alpha d, c += alpha d
    hides = overlap and setup.method != "local-sgd"
    exposed = max(0.0, round_s - setup.tau * step_s) if hides else round_s
    exposed += skew_s
    return dag.Iteration(
        step_s + exposed / setup.tau, compute, base_comm + (round_s + skew_s) / setup.tau
    )


def _node_setup(setup: Setup, links: Links) -> Setup:
    return Setup(
        method="sync-sgd",
        workers=min(setup.workers, links.ranks_per_node),
        bucket_mb=setup.bucket_mb,
        overlap=setup.overlap,
        allreduce=setup.allreduce,
        ranks_per_node=links.ranks_per_node,
    )


def _steps_per_exchange(setup: Setup) -> int:
    """A server method's worker exchanges every ``tau`` steps (async-sgd and async-msgd push
    their gradients averaged over them), hogwild-sgd's every step."""
    return 1 if setup.method in EVERY_STEP_METHODS else setup.tau


def _server(steps: StepTimes, setup: Setup, links: Links) -> tuple[float, float, float]:
    """(seconds per local step, server service per exchange, message time) in steady state."""
    n = steps.model_bytes
    crosses = setup.workers > links.ranks_per_node
    hogwild_sgd = setup.method == "hogwild-sgd"
    message = 0.0 if hogwild_sgd else message_time(n, links, crosses)
    passes = 3 if setup.method.endswith("easgd") else 2  # elastic move vs w -= lr*g (momentum: 2)
    service = passes * n * links.g + (0.0 if hogwild_sgd else links.a + links.service_load)
    tau = _steps_per_exchange(setup)
    config = SimulationConfig(
        method=setup.method,
        workers=setup.workers,
        rounds=1,
        speeds=WorkerSpeeds(step_s=steps.compute_s),
        message_s=message,
        service_s=service,
        tau=tau,
    )
    per_step = setup.workers / closed_form_throughput(config)
    return per_step, service, message


def _server_slowdown(
    alone: StepTimes, profile: HardwareProfile, setup: Setup, links: Links
) -> float:
    """The compute slowdown beside a parameter server, which takes of a core what it is busy:
    its utilisation (service time per exchange times exchanges per second), not a whole core
    (a server waiting for messages uses none). The utilisation falls as the share it takes
    slows the workers, so the share that equals its own utilisation is unique: found by
    bisection between none and a whole core (a saturated server)."""
    exchanges_per_step = 1 / _steps_per_exchange(setup)

    def utilisation(share: float) -> float:
        slowed = alone.slowed(_slowdown(profile, setup, links, share))
        per_step, service, _message = _server(slowed, setup, links)
        return min(1.0, service * setup.workers * exchanges_per_step / per_step)

    low, high = 0.0, 1.0
    if utilisation(high) >= high:
        return _slowdown(profile, setup, links, high)
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if utilisation(middle) > middle else (low, middle)
    return _slowdown(profile, setup, links, (low + high) / 2)


def _node_cpu_floor(
    alone: StepTimes,
    profile: HardwareProfile,
    setup: Setup,
    links: Links,
    service: float,
    message: float,
) -> float:
    """The fewest seconds per local step the server's node allows when its cores are what limit
    it: while each worker takes a step, the node's cores must do its workers' compute and, for
    every exchange, the server's apply and both ends of the push and of the reply (on loopback
    a message keeps its sender and its receiver busy for its whole time; between nodes the
    network carries it). A bound on the closed form's rate, which counts a message as waiting
    only; 0 on a profile without a core count (a GPU's)."""
    if profile.cores_per_node <= 0:
        return 0.0
    on_node = min(setup.workers, links.ranks_per_node)
    local_message = 0.0 if setup.workers > links.ranks_per_node else message
    exchanges = setup.workers / _steps_per_exchange(setup)
    demand = on_node * setup.threads_per_worker * alone.compute_s
    demand += exchanges * (service + 4 * local_message)
    return demand / profile.cores_per_node


def _server_link_floor(steps: StepTimes, setup: Setup, links: Links) -> float:
    """The fewest seconds per local step the server node's one link allows: while each worker
    takes a step, every worker on another node exchanges ``1/tau`` times, and each exchange
    carries the model in and (at the same time, the link being full duplex) out. The closed
    form counts each message as its worker's wait only, as if the server had a link per
    worker; 0 on one node (``hogwild-sgd``'s shared memory: no messages)."""
    remote = setup.workers - links.ranks_per_node
    if remote <= 0 or setup.method == "hogwild-sgd":
        return 0.0
    return remote * steps.model_bytes * links.inter_b / _steps_per_exchange(setup)


def predict(workload: Workload, profile: HardwareProfile, setup: Setup) -> Prediction:
    """The iteration time of ``setup`` on ``profile`` for ``workload``'s model and batch."""
    setup.check()
    setup.check_one_node(profile.name, profile.ranks_per_node)
    links = links_of(profile, setup.ranks_per_node)
    neighbours = _neighbour_slowdown(profile, setup, links)
    alone = workload.step_times(profile).slowed(neighbours)  # a core of its own, on a busy node
    if setup.method in SERVER_METHODS and not setup.method.startswith("hogwild"):
        slow = _server_slowdown(alone, profile, setup, links)
    else:
        slow = _slowdown(profile, setup, links, 0.0)
    steps = alone.slowed(slow)
    # an oversubscribed node has no idle core to run the communication beside the compute
    overlap = setup.overlap and slow <= 1.0
    details: dict[str, Any] = {
        "compute_slowdown": slow * neighbours,
        "neighbour_slowdown": neighbours,
        "overlap_effective": overlap,
    }
    meeting = setup.workers  # the ranks of one exchange: a node's in two-level-easgd's steps
    if setup.method == "two-level-easgd":
        meeting = min(setup.workers, links.ranks_per_node)
    skew = exchange_skew_s(profile, meeting, slow)
    if setup.method in COLLECTIVE_METHODS:
        details["exchange_skew_s"] = skew
    if setup.method == "sync-sgd":
        found = _sync_sgd(steps, setup, links, overlap, skew)
        it = found.pop("iteration")
        details.update(found)
        total, compute, comm = it.total_s, it.compute_s, it.comm_s
    elif setup.method in COLLECTIVE_METHODS:
        it = _rounds(steps, setup, links, overlap, skew)
        total, compute, comm = it.total_s, it.compute_s, it.comm_s
    else:
        total, service, message = _server(steps, setup, links)
        floor = _node_cpu_floor(alone, profile, setup, links, service, message)
        link_floor = _server_link_floor(steps, setup, links)
        details.update(
            {"closed_form_s": total, "node_cpu_floor_s": floor, "server_link_floor_s": link_floor}
        )
        total = max(total, floor, link_floor)
        compute = steps.compute_s
        exchanges = 1 / _steps_per_exchange(setup)
        comm = (2 * message + service) * exchanges
        details.update({"server_service_s": service, "message_s": message})
    return Prediction(
        method=setup.method,
        workers=setup.workers,
        batch_size=workload.batch_size,
        iteration_s=total,
        compute_s=compute,
        exposed_comm_s=max(0.0, total - compute),
        update_s=steps.update_s,
        comm_s=comm,
        details=details,
    )
