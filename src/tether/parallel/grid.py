"""The data x model process grid: model groups of K ranks, data-parallel groups across them.

With N ranks and model parallelism K (K divides N), rank ``r`` sits at data index ``r // K`` and
model index ``r % K``: the K ranks of a model group are consecutive (on one node, where the
activation traffic of every layer is cheapest, as Megatron-LM places its tensor-parallel ranks),
and the N/K ranks sharing a model index form a data-parallel group that holds the same slice of
every sharded layer. A data-parallel method (sync-sgd, sync-easgd, local-sgd) runs over the
data-parallel group: each model group acts as one of its workers (Coates et al., ICML 2013, ran
model parallelism inside a node of GPUs; the grid adds data parallelism across such groups).
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.comm.transport import TorchTransport
from tether.errors import TetherError


@dataclass(frozen=True)
class ProcessGrid:
    """This rank's place in the grid and the transports of its two groups."""

    world: TorchTransport
    model_parallel: int
    model: TorchTransport  # the K ranks that split each sharded layer
    data: TorchTransport  # the N/K ranks holding the same slices

    @property
    def model_rank(self) -> int:
        return self.world.rank % self.model_parallel

    @property
    def data_rank(self) -> int:
        return self.world.rank // self.model_parallel

    @property
    def data_parallel(self) -> int:
        return self.world.world_size // self.model_parallel

    @classmethod
    def build(cls, world: TorchTransport, model_parallel: int, timeout_s: float) -> ProcessGrid:
        """The grid over ``world``. Collective: every rank calls it (every rank takes part in
        creating every group). With K = 1 both groups are the world's own transport."""
        size, k = world.world_size, model_parallel
        check_grid(size, k)
        if k == 1:
            return cls(world, 1, world, world)
        models = [list(range(d * k, (d + 1) * k)) for d in range(size // k)]
        datas = [list(range(m, size, k)) for m in range(k)]
        model = world if k == size else world.split(models, timeout_s)
        data = world.split(datas, timeout_s)
        return cls(world, k, model, data)


def check_grid(workers: int, model_parallel: int) -> None:
    if model_parallel < 1 or workers % model_parallel:
        raise TetherError(
            f"model parallelism {model_parallel} must divide the {workers} workers (each model "
            "group takes that many ranks); choose workers as a multiple of it"
        )
