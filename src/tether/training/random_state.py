"""The random state a run seeds and a checkpoint keeps, so that a run is reproducible from its seed
and a resumed run draws what the uninterrupted run would have drawn after the checkpoint: dropout
masks and any other random number a model takes in training come from torch's global generators,
and a user's dataset or loss may draw from Python's ``random`` or NumPy's global generator (an
augmentation, a noise term), all of which the run seeds once at start-up (:func:`seed_generators`,
the same seed on every rank, as Lightning's ``seed_everything`` does).

Saved as tensors (a checkpoint is loaded with ``weights_only=True``): torch's CPU generator and,
on a CUDA device, that device's; Python's Mersenne Twister (its 625 words and its cached Gaussian)
and NumPy's legacy global generator (624 words, position and cached Gaussian). Restored after
everything that draws at start-up (building and seeding the model, the first evaluation batch
that fixes the metrics), which a resumed run does again before it goes on. The data order does
not depend on them: the sampler and the data loaders have generators of their own
(tether.data.sharding, training.batches), and torch seeds a loader's worker processes from the
loader's generator.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

NUMPY_SEEDS = 2**32  # numpy.random.seed takes a 32-bit seed


def seed_generators(seed: int) -> None:
    """Seed torch's, Python's and NumPy's global generators with the run's ``seed``."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % NUMPY_SEEDS)


def random_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's generators' states: torch's CPU one and ``device``'s where it is a GPU,
    Python's and NumPy's."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    version, words, gauss = random.getstate()
    state["python"] = torch.tensor([version, *words], dtype=torch.int64)
    state["python_gauss"] = torch.tensor([] if gauss is None else [gauss], dtype=torch.float64)
    _, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    numpy_words = [*np.asarray(keys).tolist(), position, has_gauss]
    state["numpy"] = torch.tensor(numpy_words, dtype=torch.int64)
    state["numpy_gauss"] = torch.tensor([cached], dtype=torch.float64)
    return state


def set_random_state(state: Any, device: torch.device) -> None:
    """Put back what :func:`random_state` saved (nothing where a checkpoint holds none: one
    written before the random state was kept; a CUDA state only on a CUDA device; Python's and
    NumPy's only where the checkpoint has them, written since they are kept)."""
    if not isinstance(state, dict):
        return
    if isinstance(state.get("cpu"), torch.Tensor):
        torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and isinstance(state.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(state["cuda"], device)
    python, python_gauss = state.get("python"), state.get("python_gauss")
    if isinstance(python, torch.Tensor) and isinstance(python_gauss, torch.Tensor):
        version, *words = python.tolist()
        gauss = python_gauss.tolist()
        random.setstate((version, tuple(words), gauss[0] if gauss else None))
    numpy, numpy_gauss = state.get("numpy"), state.get("numpy_gauss")
    if isinstance(numpy, torch.Tensor) and isinstance(numpy_gauss, torch.Tensor):
        *keys, position, has_gauss = numpy.tolist()
        keys_array = np.array(keys, dtype=np.uint32)
        np.random.set_state(("MT19937", keys_array, position, has_gauss, numpy_gauss.item()))
