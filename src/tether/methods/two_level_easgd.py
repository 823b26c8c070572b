"""two-level-easgd: gradient sums inside a node, elastic averaging across nodes (SC17, co-design 5).

The KNL design of You, Buluc and Demmel (SC17, section 5, "KNL chip partitioning"): one chip is
run as several parts, each with its own replica and data shard; the parts of a chip sum their
gradients and apply the same update, and across chips the nodes run EASGD, so that weights, not
gradients, cross the network, and only every ``tau`` steps.

Ranks are grouped into N nodes of G consecutive ranks (rank = node*G + local index; G is
``ranks_per_node`` or the launcher's local world size, so one machine can emulate nodes).

- Inside a node: synchronous SGD. The node's gradients are averaged every step by the bucketed,
  overlapped all-reduce over a node-local process group (sync-sgd's), so every rank of a node
  holds the same replica ``x_n``.
- Across nodes: synchronous EASGD rounds every ``tau`` steps, as sync-easgd's with the N node
  replicas as its workers: ``d_n = x_n - c``; ``x_n <- x_n - alpha*d_n``;
  ``c <- c + alpha * sum_n d_n``, ``alpha = 0.9/N`` by default.

Every rank, not only a node leader, holds the center. Because the ranks of a node hold the same
``d_n``, the sum over nodes is split among them: local rank i all-reduces chunk i of ``d_n`` over
the N ranks with local index i (one group per local index, spanning the nodes), and the node
then all-gathers the chunks over its fast links. Each rank sends ``2(N-1)/N * n/G`` words over
the slow links per round instead of a leader's ``2(N-1)/N * n``, every inter-node link is busy
at once, and no broadcast of the center inside a node is needed: the center update is the same
arithmetic on the same values everywhere. As in sync-easgd the cross-node sum runs under the
next ``tau`` local steps and is waited for at the next round.

The reductions: with one node there is nothing to average with and no center (the method is
sync-sgd, rounds 0); with one rank per node the node groups are single ranks and the method is
sync-easgd. Both hold bitwise (tests/distributed/test_two_level_easgd.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tether.comm.chunks import chunk_bounds
from tether.comm.fusion import GradientBucketer
from tether.comm.reducer import AllReducer, PendingReduce
from tether.comm.transport import TorchTransport
from tether.errors import TetherError
from tether.methods.base import Backward, MethodContext, StepTimes
from tether.methods.bucketed import BucketedGradients
from tether.methods.default_rates import all_workers_rate
from tether.methods.elastic import ELASTIC_SETTINGS
from tether.methods.replicated import REDUCER_SETTINGS, average_buffers
from tether.methods.sync_easgd import SyncEASGD
from tether.observe.metrics import PhaseTotals


def node_size(context: MethodContext) -> int:
    """Ranks per node: the user's ``ranks_per_node`` (emulated nodes), else the launcher's."""
    world = context.transport.world_size
    size = context.config.ranks_per_node or context.placement.ranks_on_node(world)
    if size < 1 or world % size:
        raise TetherError(
            f"two-level-easgd needs whole nodes: {world} ranks do not split into nodes of "
            f"{size}; set --ranks-per-node (ranks_per_node in Python) to a divisor of {world}"
        )
    return size


class TwoLevelEASGD(BucketedGradients, SyncEASGD):
    """Default: momentum SGD inside a node at sync-sgd's rate for the node's batch (0.1 at 256
    samples, scaled by min(r, 2), a half-epoch warm-up, the norm clipped at 2; one node is
    sync-sgd), tau 4. With 2 nodes x 2 ranks, 85% test accuracy on LeNet-5 / Fashion-MNIST took
    348 steps at lr 0.1 and 406 at 0.05 (the scaled rate of a node of 128) or with tau 1, 464
    with tau 8 or at lr 0.2, and 754 with sync-easgd's plain SGD at lr 0.4 or 0.8, tau 1
    (benchmarks/results/partition_nodes_amd-epyc-2cores.md, notes).
    """

    name = "two-level-easgd"
    per_rank_state = True
    composes_with_model_parallel = False  # its node groups are cut from the world's ranks
    defaults = {**all_workers_rate(0.1, batch="node"), "tau": 4}
    local_step_name = "sgd"
    settings = REDUCER_SETTINGS | ELASTIC_SETTINGS | {"overlap", "bucket_mb", "momentum"}

    def __init__(
        self,
        model: nn.Module,
        context: MethodContext,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        self.check_model(model)  # before the subgroups are made: refused before any collective
        world, rank = context.transport, context.transport.rank
        if not isinstance(world, TorchTransport):
            raise TetherError("two-level-easgd needs the torch transport (process subgroups)")
        self.ranks_per_node = size = node_size(context)
        # The node's size as a setting, so that the default rate scales with the node's batch
        # (lr_batch "node") also where the launcher, not the user, decides it.
        context = dataclasses.replace(
            context, config=dataclasses.replace(context.config, ranks_per_node=size)
        )
        self.nodes = world.world_size // size
        self.local_index = rank % size
        # Every rank creates every group, in the same order: the nodes, then one group per local
        # index across the nodes. A group of all ranks is the world's own transport, so that the
        # two reductions run the very operations of sync-sgd and sync-easgd.
        timeout = context.config.timeout_s
        nodes = [list(range(n * size, (n + 1) * size)) for n in range(self.nodes)]
        across = [list(range(i, world.world_size, size)) for i in range(size)]
        self.node = world if self.nodes == 1 else world.split(nodes, timeout) if size > 1 else None
        self.across = (
            world if size == 1 else world.split(across, timeout) if self.nodes > 1 else None
        )
        super().__init__(model, context, optimizer, scheduler)
        if self.node is not None:
            node_reducer = self._reducer(self.node, ranks_per_node=size)
            self.bucketer = GradientBucketer(
                list(self.model.parameters()), node_reducer, self.config.bucket_mb or None
            )

    def _reducer(self, transport: TorchTransport, ranks_per_node: int) -> AllReducer:
        config = self.context.config
        return AllReducer(
            transport,
            config.allreduce,
            config.compress,
            ranks_per_node,
            cache_dir=self.context.placement.cache_dir,
        )

    def overflow_sharing(self) -> Callable[[torch.Tensor], None] | None:
        """fp16: inside a node the gradient sum carries one rank's overflow to the others, so the
        node skips together, as sync-sgd's ranks do; across nodes each node decides alone, as an
        EASGD worker does (a skipped step still counts, so the rounds stay in lockstep), and no
        flag crosses the nodes every step. Nodes of one rank: sync-easgd's world-wide flag."""
        return None if self.node is not None else super().overflow_sharing()

    # -- the elastic level ----------------------------------------------------------------------
    def elastic_workers(self) -> int:
        return self.nodes

    def round_reducer(self) -> AllReducer:
        # Over the ranks of this local index, one per node (with one node, a placeholder over
        # the node that never starts a round).
        return self._reducer(self.across or self.transport, ranks_per_node=1)

    def step(self, backward: Backward, times: StepTimes) -> torch.Tensor | None:
        loss = self.local_update(backward, times, wait=self.wait_for_gradients)
        if self.nodes > 1 and self.local_step % self.config.tau == 0:
            times.waited(*self._complete_round())
            self._sum = self.flat - self.center  # d_n: the same on every rank of the node
            self.flat.sub_(self._sum, alpha=self.alpha)
            self._pending = self._all_reduce_async(self._sum)
            self.rounds += 1
            if not self.config.overlap:
                times.waited(*self._complete_round())
        return loss

    def _all_reduce_async(self, flat: torch.Tensor) -> list[PendingReduce]:
        """This rank's chunk of ``d_n``, summed over the nodes."""
        start, stop = chunk_bounds(flat.numel(), self.ranks_per_node)[self.local_index]
        return [self.reducer.start(flat[start:stop], average=False)]

    def _finish_sum(self, pending: list[PendingReduce]) -> None:
        super()._finish_sum(pending)
        if self.ranks_per_node > 1:  # each rank holds its chunk of the sum: the node gathers
            assert self.node is not None
            self.node.all_gather(self._sum)

    # -- the rest -------------------------------------------------------------------------------
    def finish(self, totals: PhaseTotals | None) -> None:
        super().finish(totals)
        if self.bucketer is not None:
            self.bucketer.reducer.close()
        self.remove_bucketer()

    def summary_extra(self) -> dict[str, Any]:
        return {
            **super().summary_extra(),
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
        }

    def eval_model(self) -> nn.Module:
        """The center across nodes; with one node, the node's replica (sync-sgd's)."""
        if self.nodes > 1:
            return super().eval_model()
        average_buffers(self.model, self.transport)
        return self.model

    def state_dict(self) -> dict[str, Any]:
        if self.nodes == 1:  # no center: the replica stands for it (a resume restarts from it)
            self.center.copy_(self.flat)
        return super().state_dict()
