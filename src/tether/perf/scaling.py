"""Scaling curves: a prediction (:mod:`tether.perf.predict`) at every worker count, with the
ideal line (the first count's throughput, scaled) and the parallel efficiency; weak scaling
keeps the per-worker batch, strong scaling the global batch."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from tether.perf.predict import Setup, predict
from tether.perf.profile import HardwareProfile
from tether.perf.run_setup import one_node_limit
from tether.perf.workload import Workload


class ScalingCutWarning(UserWarning):
    """A scaling curve stops before the last worker count asked for (:func:`curve_end`)."""


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
    curve ending where there are more workers than samples in the batch (:func:`curve_end`
    says why a curve is short)."""
    base_global = workload.batch_size * workers[0]
    limit = one_node_limit(setup.method, profile.ranks_per_node, setup.ranks_per_node)
    rows: list[dict[str, Any]] = []
    first = None
    for p in workers:
        if rows and ((strong and p > base_global) or (limit is not None and p > limit)):
            break  # no share left to give, or no node that holds them (the first: predict says)
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


def curve_end(
    workload: Workload,
    profile: HardwareProfile,
    setup: Setup,
    workers: list[int],
    strong: bool,
    rows: list[dict[str, Any]],
) -> str | None:
    """Why ``rows`` (:func:`scaling`'s) stop before the last of ``workers``; None if they do
    not."""
    if rows and rows[-1]["workers"] == workers[-1]:
        return None
    last = rows[-1]["workers"] if rows else 0
    limit = one_node_limit(setup.method, profile.ranks_per_node, setup.ranks_per_node)
    if limit is not None and workers[-1] > limit:
        return (
            f"{setup.method}'s curve ends at {last} workers: it shares its weights in one node's "
            f"memory ({limit} ranks per node on {profile.name})"
        )
    return (
        f"strong scaling ends at {last} workers: the global batch of "
        f"{workload.batch_size * workers[0]} has no more samples to share"
    )
