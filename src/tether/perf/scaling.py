"""Scaling curves: a prediction (:mod:`tether.perf.predict`) at every worker count, with the
ideal line (the first count's throughput, scaled) and the parallel efficiency; weak scaling
keeps the per-worker batch, strong scaling the global batch."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from tether.perf.predict import Setup, predict
from tether.perf.profile import HardwareProfile
from tether.perf.workload import Workload


def scaling(
    workload: Workload,
    profile: HardwareProfile,
    setup: Setup,
    workers: list[int],
    strong: bool,
) -> list[dict[str, Any]]:
    """Throughput and efficiency against the worker count. Weak scaling keeps the per-worker
    batch; strong scaling keeps the global batch of the first count (``batch * workers[0]``),
    each worker taking its share (the largest share, ``ceil(B / P)``, sets the step) and the
    curve ending where there are more workers than samples in the batch."""
    base_global = workload.batch_size * workers[0]
    rows = []
    first = None
    for p in workers:
        if strong and p > base_global:
            break  # no share left to give: the global batch would grow
        batch = math.ceil(base_global / p) if strong else workload.batch_size
        pred = predict(workload.at_batch(batch), profile, replace(setup, workers=p))
        rate = base_global / pred.iteration_s if strong else pred.samples_per_s
        if first is None:
            first = (p, rate)
        ideal = first[1] * p / first[0]
        rows.append(
            {
                "workers": p,
                "batch_size": batch,
                "iteration_s": pred.iteration_s,
                "samples_per_s": rate,
                "ideal_samples_per_s": ideal,
                "efficiency": rate / ideal if ideal else 0.0,
                "comm_share": pred.comm_share,
            }
        )
    return rows
