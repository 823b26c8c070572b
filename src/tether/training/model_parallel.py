"""Model parallelism in a training run: what is checked before the workers start, and how a
worker's model is sharded over its model group (:mod:`tether.parallel`).

A run with ``model_parallel = K`` over N workers is a grid of N/K model groups
(:class:`~tether.parallel.grid.ProcessGrid`): each group splits the layers the plan names and
takes one share of the global batch, and the method (sync-sgd, sync-easgd or local-sgd) runs
over the data-parallel groups, each model group acting as one of its workers.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.methods import METHODS
from tether.parallel import ProcessGrid, check_plan, parallelize, parse_plan


def composing_methods() -> list[str]:
    return [name for name in METHODS.names() if METHODS.get(name).composes_with_model_parallel]


def check_model_parallel(config: TrainConfig) -> None:
    """What can be checked from the config alone: the method composes, the plan parses (one
    TetherError line)."""
    if config.model_parallel == 1:
        return
    check_method_composes(config.method, config.model_parallel)
    if config.ranks_per_node % config.model_parallel:
        raise TetherError(
            f"ranks_per_node ({config.ranks_per_node}) must be a multiple of model_parallel "
            f"({config.model_parallel}): a model group's ranks share a node"
        )
    parse_plan(config.parallel_plan)


def check_method_composes(method: object, model_parallel: object) -> None:
    """A method that does not run with model parallelism, refused first (before the worker
    count is checked against the model groups: fixing that would only lead to this)."""
    if not isinstance(method, str) or method not in METHODS:
        return  # the config's own check names it
    if model_parallel not in (None, 1) and not METHODS.get(method).composes_with_model_parallel:
        raise TetherError(
            f"{method} does not run with model parallelism (its workers exchange whole models "
            f"with a server, shared memory or node groups); use {', '.join(composing_methods())}"
        )


def plan_option(plan: object) -> object:
    """A plan given as a dict (``{"fc1": "column"}``), as the config keeps it: ``name=kind``
    strings (anything else is left for the config's own check)."""
    if isinstance(plan, Mapping):
        return tuple(f"{name}={kind}" for name, kind in plan.items())
    return plan


def check_plan_on_model(config: TrainConfig, model: nn.Module) -> None:
    """The plan against the run's (unsharded) model: every layer exists, has a sharding rule and
    splits into ``model_parallel`` parts."""
    if config.model_parallel == 1:
        return
    check_plan(model, parse_plan(config.parallel_plan), config.model_parallel)


def build_grid(world: TorchTransport, config: TrainConfig) -> ProcessGrid | None:
    """The data x model grid of a model-parallel run (collective), None otherwise."""
    if config.model_parallel == 1:
        return None
    return ProcessGrid.build(world, config.model_parallel, config.timeout_s)


def shard_model(model: nn.Module, config: TrainConfig, grid: ProcessGrid | None) -> nn.Module:
    if grid is None:
        return model
    return parallelize(model, parse_plan(config.parallel_plan), grid.model)
