"""What a user is told about a held batch: the methods whose workers step on their own batch
hold their global batch (``global_batch_max``: 128 / P per worker beyond 2 workers, sync-easgd
64 / P beyond 1), so a run's batch is not always the 64 the user may expect. ``tether train``
names it on its first line, ``tether predict`` says where its predictions are at another batch
than training would run."""

from __future__ import annotations

import dataclasses

from tether.config import MAX_WORKERS, TrainConfig
from tether.config_sources import held_batch_size


def batch_text(config: TrainConfig, given: set[str]) -> str:
    """The run's per-worker batch (per model group under model parallelism) for its first
    line, saying so when the method's defaults shrank it (``global_batch_max``: a user who did
    not ask for 16 is told why). A resumed run keeps its batch, whoever chose it, and is not
    told."""
    # the ranks of a model group share their batch: it is the group's, not each rank's
    per = "per model group" if config.model_parallel > 1 else "per worker"
    text = f"batch {config.batch_size} {per}"
    if config.resume:
        return text
    default = TrainConfig.batch_size
    held = held_batch_size(dataclasses.replace(config, batch_size=default))
    if "batch_size" not in given and config.batch_size == held != default:
        holder = "you hold the" if "global_batch_max" in given else "the method holds its"
        text += f" ({holder} global batch at {config.global_batch_max}; --batch-size)"
    return text


def held_batches_note(methods: list[str], counts: list[int], batch: int) -> str | None:
    """A line for predictions at the default batch where ``tether train``'s defaults would run
    another: the methods that hold their global batch (``global_batch_max``) shrink a worker's
    batch beyond 2 workers (sync-easgd beyond 1), and a prediction at 64 is then not the run
    the user would get.
    Consecutive counts with one batch are a range (a weak-scaling curve: 16 on 8 to 4096).
    A prediction has no worker cap (it is a model, not a run), so counts beyond ``tether
    train``'s ``MAX_WORKERS`` take the same held-batch rule, applied past the config's check."""
    from tether.catalog import resolve_config  # the registries: torch, not at the CLI's start

    held = []
    for method in methods:
        spans: list[tuple[int, int, int]] = []  # (first count, last count, batch)
        for p in sorted(set(counts)):
            # the method's defaults as a run would resolve them, at a count the config takes
            config = resolve_config(None, {"method": method, "workers": min(p, MAX_WORKERS)})
            unheld = dataclasses.replace(config, workers=p, batch_size=TrainConfig.batch_size)
            trained = held_batch_size(unheld)
            if trained == batch:
                continue
            if spans and spans[-1][2] == trained:
                spans[-1] = (spans[-1][0], p, trained)
            else:
                spans.append((p, p, trained))
        if spans:
            where = ", ".join(
                f"{b} on {first}" if first == last else f"{b} on {first} to {last}"
                for first, last, b in spans
            )
            held.append(f"{method}: {where} workers")
    if not held:
        return None
    return (
        f"note: these predictions are at batch {batch} per worker; tether train's defaults "
        f"would run {'; '.join(held)} (the method holds its global batch): --batch-size N "
        "predicts another batch"
    )
