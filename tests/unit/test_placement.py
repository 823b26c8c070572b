"""Backend and device choice per rank (tether.launch.worker.resolve_backend): NCCL needs a GPU
per rank on the node, so ``auto`` falls back to gloo where there are fewer, and an explicit
``nccl`` is refused in one line. The GPU count is faked: CI has none. A rank's cores
(tether.launch.worker.partition_node) under each launcher, with the masks and the cgroup faked:
this machine has two cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tether.catalog import check_launch, gpu_free_ranks, method_backend
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.launch import cpuset, worker
from tether.launch.env import DistEnv
from tether.launch.partition import Partition, apply_partition
from tether.launch.worker import partition_node, place, resolve_backend


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    def set_count(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return set_count


def test_auto_uses_nccl_only_with_a_gpu_per_rank(gpus) -> None:
    gpus(0)
    assert resolve_backend("auto", 1) == "gloo"
    gpus(1)
    assert resolve_backend("auto", 1) == "nccl"
    assert resolve_backend("auto", 4) == "gloo"  # 4 ranks cannot share one GPU under NCCL
    gpus(8)
    assert resolve_backend("auto", 4) == "nccl"


def test_explicit_backends(gpus) -> None:
    gpus(1)
    assert resolve_backend("gloo", 4) == "gloo"
    assert resolve_backend("nccl", 1) == "nccl"
    with pytest.raises(TetherError, match="nccl needs one GPU per rank: 2 ranks on this node, 1"):
        resolve_backend("nccl", 2)


def _env(source: str, local_rank: int, local_world_size: int) -> DistEnv:
    return DistEnv(local_rank, 8, local_rank, local_world_size, "n0", 29500, None, source)


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch):
    """This process's mask and the job's cores, faked; the partition is recorded, not applied."""
    applied: list[tuple[Partition, int]] = []

    def set_node(mask: list[int], job_cores: int) -> list[tuple[Partition, int]]:
        monkeypatch.setattr(worker, "usable_cores", lambda: mask)
        monkeypatch.setattr(worker, "job_core_count", lambda: job_cores)
        monkeypatch.setattr(worker, "apply_partition", lambda p, r: applied.append((p, r)))
        return applied

    return set_node


@pytest.mark.parametrize("source", ["slurm", "mpi"])
def test_a_rank_bound_to_its_own_cores_keeps_them(node, source: str) -> None:
    # srun --cpus-per-task 8 --cpu-bind=cores, 4 tasks on a 64-core node: local rank 2 holds 16-23
    node(list(range(16, 24)), 64)
    partition = partition_node(_env(source, 2, 4), 0, True)
    assert partition.threads_per_worker == 8  # was 2, pinned to 20 and 21
    assert partition.own_cores == tuple(range(16, 24))


def test_a_shared_mask_is_divided(node) -> None:
    # srun --cpu-bind=none in a job confined (cgroup) to 32 cores: the 4 tasks share them
    node(list(range(32)), 32)
    partition = partition_node(_env("slurm", 2, 4), 0, True)
    assert (partition.threads_per_worker, partition.own_cores) == (8, None)
    assert partition.core_groups is not None and partition.core_groups[2] == tuple(range(16, 24))
    # srun torchrun on 8 bound cores: torchrun's workers share its mask, whatever its width
    node(list(range(16, 24)), 64)
    partition = partition_node(_env("torchrun", 2, 4), 0, True)
    assert (partition.threads_per_worker, partition.own_cores) == (2, None)
    assert partition.core_groups is not None and partition.core_groups[2] == (20, 21)


def test_a_partition_of_own_cores_pins_to_them() -> None:
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    first = min(before)
    try:
        assert apply_partition(Partition(4, 1, None, (first,)), 3) == (first,)
        assert os.sched_getaffinity(0) == {first} and torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


def _cgroup(tmp_path: Path, lines: str, files: dict[str, str]) -> tuple[Path, Path]:
    tmp_path.mkdir()
    proc = tmp_path / "cgroup"
    proc.write_text(lines)
    root = tmp_path / "fs"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return proc, root


def test_the_job_cores_come_from_the_cpuset_cgroup(tmp_path: Path) -> None:
    assert cpuset.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    # cgroup v1: the cpuset hierarchy (a SLURM step confined to 4 cores)
    v1 = _cgroup(
        tmp_path / "v1",
        "4:memory:/slurm/uid_0/job_7\n3:cpuset:/slurm/uid_0/job_7/step_0\n0::/\n",
        {"cpuset/slurm/uid_0/job_7/step_0/cpuset.effective_cpus": "4-7\n"},
    )
    assert cpuset.cgroup_cpus(*v1) == {4, 5, 6, 7}
    # cgroup v2: a group without the cpuset controller has its nearest ancestor's cores
    v2 = _cgroup(
        tmp_path / "v2",
        "0::/system.slice/job.scope\n",
        {"system.slice/cpuset.cpus.effective": "0-1,6-7\n", "system.slice/job.scope/x": ""},
    )
    assert cpuset.cgroup_cpus(*v2) == {0, 1, 6, 7}
    # a container that mounts its own group as the root
    mounted = _cgroup(tmp_path / "c", "0::/docker/abc\n", {"cpuset.cpus.effective": "2-3"})
    assert cpuset.cgroup_cpus(*mounted) == {2, 3}
    assert cpuset.cgroup_cpus(tmp_path / "none", tmp_path) is None


def _placed(ranks: int, servers: int, requested: str = "auto") -> list[str]:
    """Each local rank's device on one node of ``ranks`` ranks (rank 0 a server if ``servers``)."""
    devices = []
    for rank in range(ranks):
        env = DistEnv(rank, ranks, rank, ranks, "127.0.0.1", 29500, None)
        devices.append(str(place(requested, env, servers)[1]))
    return devices


def test_a_parameter_servers_workers_get_the_gpus(gpus, monkeypatch) -> None:
    # torchrun --nproc-per-node 3 with async-sgd on a 2-GPU node: 2 workers and the server. The
    # server counted as a rank wanting a GPU, so auto chose gloo and nothing ran on the GPUs.
    current: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    gpus(2)
    assert resolve_backend("auto", 3, servers=1) == "nccl"
    assert _placed(3, servers=1) == ["cpu", "cuda:1", "cuda:0"]  # the server on the CPU
    assert current == [torch.device("cuda", 1), torch.device("cuda", 0)]
    assert _placed(3, servers=1, requested="nccl") == ["cpu", "cuda:1", "cuda:0"]
    gpus(3)  # a GPU for every rank: the server keeps GPU 0, as before
    assert _placed(3, servers=1) == ["cuda:0", "cuda:1", "cuda:2"]
    gpus(1)  # fewer GPUs than workers: all on the CPU
    assert _placed(3, servers=1) == ["cpu", "cpu", "cpu"]
    with pytest.raises(TetherError, match=r"one GPU per worker: 2 workers on this node .*, 1 GPU"):
        resolve_backend("nccl", 3, servers=1)


def test_sync_methods_and_hogwild_still_want_a_gpu_per_rank(gpus, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    gpus(2)
    assert _placed(2, servers=0) == ["cuda:0", "cuda:1"]
    assert _placed(3, servers=0) == ["cpu", "cpu", "cpu"]
    assert [gpu_free_ranks(m) for m in ("async-sgd", "async-easgd", "original-easgd")] == [1] * 3
    # hogwild's ranks share a vector in host memory; sync methods have no server
    assert [gpu_free_ranks(m) for m in ("hogwild-sgd", "hogwild-easgd", "sync-sgd")] == [0] * 3
    gpus(1)  # tether train's check before launch: a server and one worker on one GPU
    check_launch(TrainConfig(method="async-sgd", workers=1, backend="nccl"))
    with pytest.raises(TetherError, match="one GPU per rank: 2 ranks"):
        check_launch(TrainConfig(method="sync-sgd", workers=2, backend="nccl"))


def test_hogwild_runs_on_the_cpu_where_the_node_has_gpus(gpus) -> None:
    """Its vector is shared in host memory: auto chose NCCL on a node with a GPU per rank, and
    the method then refused to start ("run it on CPU (--backend gloo)")."""
    gpus(4)
    for method in ("hogwild-sgd", "hogwild-easgd"):
        assert method_backend(method, "auto") == "gloo"
        assert method_backend(method, "nccl") == "nccl"  # asked for: the method says no
    assert method_backend("sync-sgd", "auto") == "auto"  # the node's GPUs decide
    assert resolve_backend(method_backend("sync-sgd", "auto"), 3) == "nccl"
