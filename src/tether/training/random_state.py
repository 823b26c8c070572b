"""The random state a checkpoint keeps, so that a resumed run draws what the uninterrupted run
would have drawn after the checkpoint: dropout masks and any other random number a model takes in
training come from torch's global generators, which the run seeds once at start-up.

Saved as byte tensors (a checkpoint is loaded with ``weights_only=True``): the CPU generator's
state and, on a CUDA device, that device's. Restored after everything that draws at start-up
(building and seeding the model, the first evaluation batch that fixes the metrics), which a
resumed run does again before it goes on. The data order does not depend on them: the sampler
and the data loaders have generators of their own (tether.data.sharding, training.batches).
"""

from __future__ import annotations

from typing import Any

import torch


def random_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's generators' states: the CPU's, and ``device``'s where it is a GPU."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_random_state(state: Any, device: torch.device) -> None:
    """Put back what :func:`random_state` saved (nothing where a checkpoint holds none: one
    written before the random state was kept; a CUDA state only on a CUDA device)."""
    if not isinstance(state, dict):
        return
    if isinstance(state.get("cpu"), torch.Tensor):
        torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and isinstance(state.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(state["cuda"], device)
