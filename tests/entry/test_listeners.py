"""Nothing a run starts listens outside loopback (issue: the launcher's two stores listened on
every interface, unauthenticated). The run's listening sockets are read from /proc while it
trains: every process of its tree, every TCP socket in the LISTEN state
(tests.conftest.run_cli_listening).

Each run is one another test needs as well, which is checked here too: the asynchronous run is
the healthy one of the lost-worker tests (tests/entry/test_worker_loss.py), and `tether bench comm`
is watched in its own end-to-end test (tests/entry/test_bench_comm_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import is_loopback, requires_fashion_mnist, run_cli_listening
from tests.entry.test_worker_loss import ASYNC


@requires_fashion_mnist
@pytest.mark.parametrize("method", ["async-easgd"])  # a server, its workers and supervisors
def test_a_local_run_listens_on_loopback_only(tmp_path: Path, method: str) -> None:
    run = tmp_path / "run"
    # 250 steps: the run lasts longer than its --timeout of 3 s (checked below)
    args = ["train", *ASYNC, "--method", method, "--steps", "250", "--eval-every", "50"]
    result, seen = run_cli_listening(*args, "--timeout", "3", "--out", str(run))
    assert result.returncode == 0, result.stderr[-3000:]
    # The rendezvous store and the workers' store at least (gloo's pairs add their own).
    assert len(seen) >= 2, seen
    outside = sorted(a for a in seen if not is_loopback(a))
    assert outside == [], f"listening outside loopback: {outside}"

    # A healthy run longer than --timeout loses nobody: the server's liveness watches wait for a
    # whole run; they must not time out with --timeout.
    summary = json.loads((run / "summary.json").read_text())
    assert summary["wall_time_s"] > 3  # otherwise this check proves nothing
    assert summary["lost_workers"] == [] and summary["steps"] == 250
    assert "lost workers" not in result.stdout
    assert not (run / "lost").exists()  # the supervisors' marks went with the run
