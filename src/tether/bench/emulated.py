"""Run the collective benchmark's ranks on emulated nodes: network namespaces joined by veth
links, optionally shaped with tbf (:mod:`tether.launch.netns`), one torchrun job across them.

This is how `tether bench comm --nodes 2 --link-mbit 1000` measures what a two-level machine
does to the algorithms (docs/communication.md: a hierarchical all-reduce sends n/G bytes per
rank over the slow links where a flat ring sends 2(P-1)/P*n) without renting one. Needs root and
``ip``/``tc``; the one-line error says why where they are missing.
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from tether.errors import TetherError, WorkerFailure


def check_nodes(workers: int, nodes: int, link_mbit: float | None) -> None:
    """Refuse a layout the emulation cannot run, before anything starts."""
    if nodes < 1:
        raise TetherError(f"--nodes must be >= 1, got {nodes}")
    if link_mbit is not None and not (0 < link_mbit < math.inf):  # nan too
        raise TetherError(f"--link-mbit must be a finite rate > 0, got {link_mbit:g}")
    if link_mbit is not None and nodes < 2:
        raise TetherError("--link-mbit shapes the links between emulated nodes: give --nodes >= 2")
    if workers % nodes:
        raise TetherError(
            f"--workers {workers} does not split into --nodes {nodes} equal nodes; use a "
            f"multiple of {nodes}"
        )


def launch_emulated(
    workers: int,
    nodes: int,
    link_mbit: float | None,
    module: str,
    argv: Sequence[str],
    timeout_s: float,
    run_dir: Path,
) -> None:
    """``workers`` ranks of ``module`` in ``nodes`` namespaces (``workers // nodes`` each); the
    nodes' output goes to ``run_dir/nodes.log``. A failed or hung node ends the whole job."""
    from tether.launch.netns import EmulatedCluster, available
    from tether.launch.netns_torchrun import torchrun_across

    reason = available()
    if reason is not None:
        raise TetherError(f"--nodes needs network namespaces, which are unavailable: {reason}")
    # An emulated network lives for one run: calibrate it afresh, never reuse the cache of
    # another link rate (the cache is keyed by host, backend and group shape), even when --out
    # names the directory of an earlier run.
    shutil.rmtree(run_dir / "calibration", ignore_errors=True)
    with EmulatedCluster(nodes, link_mbit=link_mbit) as cluster:
        result = torchrun_across(
            cluster,
            workers // nodes,
            ["-m", module, *argv],
            timeout=timeout_s + 60,  # start-up of every node's torchrun, then the ranks' deadline
            env={"TETHER_CACHE_DIR": str(run_dir / "calibration")},
            python=sys.executable,
        )
    (run_dir / "nodes.log").write_text(result.output())
    failure = result.failure()
    if failure is not None:
        raise WorkerFailure(f"{failure} (output in {run_dir / 'nodes.log'})", [])
