"""Chip partitioning: threads and cores per worker take effect inside the workers, as read back
there; summary.json records the partition; more threads than cores are refused in one line."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import tether
from tests.conftest import run_cli
from tether.catalog import OneNodeWarning, check_launch
from tether.cli import build_parser
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.launch.partition import mask_is_own, plan_partition, usable_cores
from tether.train_options import config_from_args

PROBE_DIR = "TETHER_TEST_PROBE_DIR"
CORES = usable_cores()


class Probe(nn.Module):
    """Built inside each worker: records what that process got (its intra-op threads and the
    cores it may run on) before training a linear model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        rank = os.environ.get("RANK")
        if rank is not None and PROBE_DIR in os.environ:
            seen = {"threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0))}
            (Path(os.environ[PROBE_DIR]) / f"rank-{rank}.json").write_text(json.dumps(seen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _data() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=gen)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _seen_by_workers(tmp_path: Path, name: str, **options) -> tuple[list[dict], dict]:
    probe = tmp_path / f"probe-{name}"
    probe.mkdir()
    os.environ[PROBE_DIR] = str(probe)
    try:
        result = tether.fit(
            model=Probe, train_data=_data(), batch_size=8, steps=2, out=tmp_path / name, **options
        )
    finally:
        del os.environ[PROBE_DIR]
    ranks = sorted(probe.glob("rank-*.json"))
    return [json.loads(p.read_text()) for p in ranks], result.summary["partition"]


def test_plan_divides_the_cores_and_pins_only_parts_that_fit() -> None:
    eight = list(range(8))
    plan = plan_partition(4, 0, True, eight)
    assert plan.threads_per_worker == 2
    assert plan.core_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert plan_partition(3, 0, True, eight).core_groups == ((0, 1), (2, 3), (4, 5))
    assert plan_partition(2, 3, True, eight).core_groups == ((0, 1, 2), (3, 4, 5))
    assert plan_partition(4, 0, False, eight).core_groups is None
    # more processes than cores: one thread each, sharing every core (no pinning)
    crowded = plan_partition(12, 0, True, eight)
    assert (crowded.threads_per_worker, crowded.core_groups) == (1, None)
    # ... and so with one thread each asked for (it was refused, advising that very setting)
    assert plan_partition(12, 1, True, eight) == crowded
    with pytest.raises(TetherError, match="4 workers x 3 threads need 12 cores") as refused:
        plan_partition(4, 3, True, eight)
    assert "--threads-per-worker 2" in str(refused.value)


def test_a_mask_bound_per_task_is_kept_whole() -> None:
    # srun --cpus-per-task 8 --cpu-bind=cores: this task's mask is its own 8 cores, 4 tasks here
    task = list(range(16, 24))
    assert mask_is_own(task, 4, 64) and mask_is_own(task, 4, 32)
    plan = plan_partition(4, 0, True, task, own_mask=True)
    assert (plan.threads_per_worker, plan.own_cores, plan.core_groups) == (8, tuple(task), None)
    assert plan.summary()["own_cores"] == task
    assert plan_partition(4, 2, True, task, own_mask=True).own_cores == (16, 17)
    assert plan_partition(4, 2, False, task, own_mask=True).own_cores == tuple(task)
    with pytest.raises(
        TetherError, match="launcher bound this process to 8: use --threads-per-worker 8"
    ):
        plan_partition(4, 9, True, task, own_mask=True)
    # a mask every rank of the node shares: the job's cores, or wider than a share of them
    assert not mask_is_own(list(range(32)), 4, 32)  # srun --cpu-bind=none in a 32-core job
    assert not mask_is_own(list(range(32)), 4, 64)  # mpiexec --bind-to socket, 2 ranks a socket
    assert not mask_is_own(task, 1, 64)  # alone on the node: nothing to divide
    assert "own_cores" not in plan_partition(4, 0, True, list(range(8))).summary()


def test_threads_and_cores_take_effect_inside_the_workers(tmp_path: Path) -> None:
    each = max(1, len(CORES) // 2)
    seen, partition = _seen_by_workers(tmp_path, "two", method="sync-sgd", workers=2)
    assert [s["threads"] for s in seen] == [each, each]
    if len(CORES) >= 2:  # each worker on its own cores, none shared
        groups = [CORES[:each], CORES[each : 2 * each]]
        assert sorted(s["cores"] for s in seen) == groups
        assert partition == {
            "workers_per_node": 2,
            "threads_per_worker": each,
            "core_groups": groups,
        }


@pytest.mark.slow
def test_other_partitions_take_effect_inside_the_workers(tmp_path: Path) -> None:
    # One launch each: a lone worker, workers left unpinned, and a parameter server.
    seen, partition = _seen_by_workers(tmp_path, "one", method="sync-sgd", workers=1)
    assert seen == [{"threads": len(CORES), "cores": CORES}]
    assert partition["threads_per_worker"] == len(CORES)

    seen, partition = _seen_by_workers(
        tmp_path, "unpinned", method="local-sgd", workers=2, threads_per_worker=1, pin_workers=False
    )
    assert seen == [{"threads": 1, "cores": CORES}] * 2
    assert partition["core_groups"] is None

    # a parameter server is one more part of the node
    seen, partition = _seen_by_workers(tmp_path, "server", method="async-sgd", workers=1)
    assert len(seen) == 2 and partition["workers_per_node"] == 2


def test_more_threads_than_cores_is_refused_in_one_line(tmp_path: Path) -> None:
    too_many = len(CORES) + 1
    out = tmp_path / "run"
    result = run_cli(
        "train", "--workers", "1", "--threads-per-worker", str(too_many), "--out", str(out)
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"1 workers x {too_many} threads need {too_many} cores" in lines[0]
    assert not out.exists()


def test_command_line_options_reach_the_config() -> None:
    # Every store_true/store_false flag must be listed among the keys the command line sets
    # (--no-pin-workers was parsed and then dropped before).
    args = build_parser().parse_args(
        ["train", "--no-pin-workers", "--threads-per-worker", "1", "--steps", "1"]
    )
    config = config_from_args(args, lambda c: "unused")
    assert (config.pin_workers, config.threads_per_worker) == (False, 1)
    assert build_parser().parse_args(["train"]).__dict__.get("pin_workers", True) is True


def test_two_level_on_one_node_says_it_runs_as_sync_sgd() -> None:
    with pytest.warns(OneNodeWarning, match="all 2 workers on one node runs as sync-sgd"):
        check_launch(TrainConfig(method="two-level-easgd", workers=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", OneNodeWarning)
        check_launch(TrainConfig(method="two-level-easgd", workers=2, ranks_per_node=1))
