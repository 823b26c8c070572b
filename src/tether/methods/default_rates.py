"""The methods' default learning rates as functions of the run's batch.

A default rate is tuned at a reference batch and scaled for another one with the
``linear-capped`` rule (``TrainConfig.scaled_lr``): in proportion to the batch (the linear
scaling rule, Goyal et al. 2017) up to a cap, constant beyond it. Which batch counts depends on
what one update averages over (``lr_batch``). For momentum SGD on all workers' batches the cap
is twice the reference, guarded by a clip of the gradient's global norm at 2
(benchmarks/results/clip_sweep_*.md, LeNet-5 at a global batch of 512: unclipped, the linear
rule's 0.2 crawled and 0.12 diverged, so the cap was the reference rate, 0.1, which missed 88%
in 5 epochs on two seeds; clipped at 2, about twice the median norm of a batch-64 gradient, 0.2
reached 88% in 3.72 epochs on both seeds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether.config import TrainConfig
from tether.config_sources import HELD_WORKERS

GLOBAL_REFERENCE = 256  # samples of all workers' batches (4 workers x 64)
GLOBAL_SCALE_MAX = 2.0  # the linear rule up to 2 x 256 samples: measured stable there when clipped
GLOBAL_CLIP_NORM = 2.0  # the gradient's global norm clipped at 2 with the scaled default rate
WORKER_REFERENCE = 64  # the default per-worker batch
ASYNC_REFERENCE_WORKERS = 4  # the parameter-server methods' rates were tuned on 4 workers
OWN_BATCH_GLOBAL = 128  # own-batch methods' workers' batches together, beyond 2 workers
SYNC_EASGD_HELD = 64  # sync-easgd's: one worker's batch (own_batch_rate)


def all_workers_rate(lr: float, batch: str = "global") -> dict[str, Any]:
    """Defaults for momentum SGD on every worker's batch together (sync-sgd's all-reduced
    gradient, local-sgd's averaged replicas; ``batch="node"``: one node's, two-level-easgd),
    ``lr`` at 256 samples, scaled linearly up to twice that, with a linear warm-up over the first
    half epoch (it took sync-sgd at 4 workers from 3.97 to 2.97 epochs to 88%) and the
    gradient's norm clipped at 2 (what makes the doubled rate stable: module docstring)."""
    return {
        "lr": lr,
        "lr_base_batch": GLOBAL_REFERENCE,
        "lr_batch": batch,
        "lr_scaling": "linear-capped",
        "lr_scale_max": GLOBAL_SCALE_MAX,
        "warmup_epochs": 0.5,
        "clip_grad_norm": GLOBAL_CLIP_NORM,
    }


def own_batch_rate(lr: float, damped: bool = False, held: int = OWN_BATCH_GLOBAL) -> dict[str, Any]:
    """Defaults for a worker stepping on its own batch (the EASGD family, the parameter-server
    and Hogwild methods): ``lr`` at a worker's batch of 64, times ``min(sqrt(r), 1)``, and the
    global batch held at ``held`` samples up to 8 workers (128: a worker's batch 128 / P beyond
    2 workers; :func:`tether.config_sources.held_batch_size`); ``damped``: the step is also
    damped beyond 4 workers (:func:`damped_step`).

    Why hold the global batch: an EASGD worker is tied to the others only through the center
    (SC17 section 3), which gains about one worker's step per step, so its progress per epoch
    is the number of steps a worker takes, ``N / (P * b)``; a parameter server updates once
    per push, ``N / b`` times an epoch. At a fixed batch the first falls with every worker
    added, a larger rate diverged, and on 8 workers five of these methods missed 85% in 3
    epochs on LeNet-5; held at 128 they reach it. The square root, not the linear rule, because
    the stable rate followed it: the square-root rate is half the rate that diverged at a
    batch of 16 and 32 (benchmarks/results/easgd_batch_sweep_*.md). sync-easgd holds one
    worker's batch, 64 (``SYNC_EASGD_HELD``), so that its workers take as many steps an epoch
    as one worker alone: held at 128 on 8 workers it reached 88% in 5 epochs on LeNet-5 at the
    last evaluation or not at all (seeds 0-2), held at 64 at 4.0 and 4.5 epochs (seeds 1, 2;
    seed 0 ended at 87.9%), and at 2 and 4 workers sooner too
    (benchmarks/results/sync_easgd_batch_*.md, defaults_*.md)."""
    rate: dict[str, Any] = {
        "lr": lr,
        "lr_base_batch": WORKER_REFERENCE,
        "lr_batch": "worker",
        "lr_scaling": "sqrt-capped",
        "global_batch_max": held,
    }
    if damped:
        rate["async_base_workers"] = ASYNC_REFERENCE_WORKERS
    return rate


def damped_step(lr: float, momentum: float, damping: float) -> tuple[float, float]:
    """The rate and momentum of an asynchronous step damped by ``damping`` = s
    (``TrainConfig.async_damping``): the effective step ``lr / (1 - momentum)`` times s, taken
    from the momentum first (``1 - momentum`` over s, not below momentum 0: the staleness of P
    workers is itself momentum, Mitliagkas et al. 2016, so explicit momentum is what to give
    up), and from the rate for the rest.

    benchmarks/results/async_workers_sweep_*.md, 8 workers (s = 0.5): async-msgd at its 4-worker
    momentum 0.9 ended at 68.3%, at 0.8 (this rule) 84.7%, at 0.9 with half the rate 82.9%;
    async-sgd at half its rate reached 85% in 2.97 epochs, at its own rate 84.4% after 3."""
    if damping >= 1.0:
        return lr, momentum
    damped_momentum = max(0.0, 1.0 - (1.0 - momentum) / damping)
    return lr * damping * (1.0 - damped_momentum) / (1.0 - momentum), damped_momentum


BATCH_COUNTED = {
    "global": "all workers' batches",
    "node": "one node's batches",
    "worker": "each worker's own batch",
}
SCALING_TEXT = {
    "linear": "r",
    "sqrt": "sqrt(r)",
    "linear-capped": "min(r, {cap:g})",
    "sqrt-capped": "min(sqrt(r), {cap:g})",
}
# the keys describe_rate reads into the rate's own text
RATE_KEYS = (
    "lr",
    "lr_base_batch",
    "lr_batch",
    "lr_scaling",
    "lr_scale_max",
    "async_base_workers",
    "global_batch_max",
)


def describe_rate(defaults: Mapping[str, Any]) -> str:
    """A method's defaults as a user reads them (``tether list``): the rate at its reference
    batch, the rule and which batch counts, then its other defaults."""
    base = defaults.get("lr_base_batch")
    rate = f"lr {defaults.get('lr', TrainConfig.lr):g}"
    if base:
        counted = BATCH_COUNTED[defaults.get("lr_batch", "global")]
        rule = SCALING_TEXT[defaults.get("lr_scaling", "linear")].format(
            cap=defaults.get("lr_scale_max", TrainConfig.lr_scale_max)
        )
        rate += f" x {rule}, r = B / {base}, B = {counted}"
    workers = defaults.get("async_base_workers")
    if workers:
        rate += f"; beyond {workers} workers P the step is damped by {workers} / P"
    held = defaults.get("global_batch_max")
    if held:
        rate += (
            f"; batch {held} / P per worker beyond {held // TrainConfig.batch_size} "
            f"worker{'s' if held > TrainConfig.batch_size else ''} (at least "
            f"{held // HELD_WORKERS}; a rate you give runs at {TrainConfig.batch_size})"
        )
    others = [
        f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
        for key, value in defaults.items()
        if key not in RATE_KEYS
    ]
    return ", ".join([rate, *others])
