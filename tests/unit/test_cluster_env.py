"""tether.init's view of each launcher: torchrun, SLURM, MPI (MPICH and Open MPI), Kubeflow.

torchrun and mpiexec are also run for real (tests/entry/test_init_e2e.py); SLURM and Kubeflow are
checked here by the variables they set."""

from __future__ import annotations

import pytest

from tether.errors import TetherError
from tether.launch.env import (
    DistEnv,
    launcher_local_world_size,
    server_wire_address,
)
from tether.launch.slurm_lists import first_host, tasks_per_node

LAUNCHER_VARIABLES = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_ID",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "TETHER_RUN_ID",
    "TETHER_METHOD",
    "TETHER_LAUNCH_REPORTS",
    "TETHER_SERVER_ADDR",
]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _setenv(patch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for key, value in values.items():
        patch.setenv(key, value)


def test_torchrun(clean_env: pytest.MonkeyPatch) -> None:
    values = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "n0",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        # torchrun started by mpiexec (one per node): torchrun, nearer the process, wins
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
    }
    _setenv(clean_env, values)
    env = DistEnv.detect()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 8, 1, 2)
    assert (env.master_addr, env.master_port, env.source, env.agent_store) == (
        "n0",
        29500,
        "torchrun",
        True,
    )


def test_kubeflow_pytorchjob(clean_env: pytest.MonkeyPatch) -> None:
    _setenv(
        clean_env,
        {
            "RANK": "2",
            "WORLD_SIZE": "4",
            "MASTER_ADDR": "job-master-0",
            "MASTER_PORT": "23456",
        },
    )
    env = DistEnv.detect()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (2, 4, 0, 1)
    assert (env.master_addr, env.master_port, env.source) == ("job-master-0", 23456, "kubeflow")


def test_slurm_srun_step(clean_env: pytest.MonkeyPatch) -> None:
    values = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-10],cpu1",
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
    }
    _setenv(clean_env, values)
    env = DistEnv.detect()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 2)
    assert (env.master_addr, env.master_port, env.source) == ("gpu07", 20000 + 3456, "slurm")
    clean_env.setenv("MASTER_PORT", "29400")
    assert DistEnv.detect().master_port == 29400


@pytest.mark.parametrize(
    ("layout", "rank", "node", "local"),
    [
        ("3,1", 3, 1, (0, 1)),  # the last rank alone on the second node
        ("3,1", 1, 0, (1, 3)),
        ("1,4", 2, 1, (1, 4)),  # the first node has 1 task, the second 4
        ("2(x3),1", 5, 2, (1, 2)),
        ("2(x3),1", 6, 3, (0, 1)),
    ],
)
@pytest.mark.parametrize("given", [True, False], ids=["srun", "block-layout"])
def test_slurm_uneven_steps(
    clean_env: pytest.MonkeyPatch,
    layout: str,
    rank: int,
    node: int,
    local: tuple[int, int],
    given: bool,
) -> None:
    # each node's count is looked up by SLURM_NODEID; without SLURM_NODEID/SLURM_LOCALID
    # (srun sets both) srun's default block distribution places the ranks
    world = sum(tasks_per_node(layout))
    values = {"SLURM_PROCID": str(rank), "SLURM_STEP_NUM_TASKS": str(world)}
    values["SLURM_STEP_TASKS_PER_NODE"] = layout
    if given:
        values |= {"SLURM_NODEID": str(node), "SLURM_LOCALID": str(local[0])}
    _setenv(clean_env, values)
    env = DistEnv.detect()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (
        rank,
        world,
        *local,
    )


def test_slurm_tasks_per_node_lists() -> None:
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]
    assert tasks_per_node("3,1") == [3, 1]
    with pytest.raises(ValueError):
        tasks_per_node("2(3)")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "SLURM_STEP_TASKS_PER_NODE='two' is not a SLURM"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2,2", "SLURM_NODEID": "2"}, "on none of the 2 nodes"),
        (
            {"SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1", "SLURM_LOCALID": "1"},
            "not one of the 1 tasks",
        ),
    ],
)
def test_slurm_layouts_that_contradict_themselves(
    clean_env: pytest.MonkeyPatch, values: dict[str, str], message: str
) -> None:
    _setenv(clean_env, {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", **values})
    with pytest.raises(TetherError, match=message) as refused:
        DistEnv.detect()
    assert "\n" not in str(refused.value) and "srun" in str(refused.value)


@pytest.mark.parametrize(
    "values",
    [
        {"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "3"},
        {
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "3",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
        },
    ],
    ids=["mpich", "openmpi"],
)
def test_mpi(clean_env: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    _setenv(clean_env, values)
    env = DistEnv.detect()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (1, 3, 1, 3)
    assert env.source == "mpi" and env.master_port is None  # agreed on through MPI


@pytest.mark.parametrize(
    ("rank", "size", "local_size"),
    [
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"),
    ],
    ids=["openmpi", "hydra"],
)
def test_mpi_port_without_address(
    clean_env: pytest.MonkeyPatch, rank: str, size: str, local_size: str
) -> None:
    _setenv(clean_env, {rank: "1", size: "4", local_size: "4", "MASTER_PORT": "29500"})
    # every rank on this machine: loopback is where they meet
    env = DistEnv.detect()
    assert (env.master_addr, env.master_port, env.local_world_size) == ("127.0.0.1", 29500, 4)
    # 2 of the 4 ranks here: the others could not reach this machine's loopback
    clean_env.setenv(local_size, "2")
    with pytest.raises(TetherError, match="set MASTER_ADDR to rank 0's host") as refused:
        DistEnv.detect()
    assert "4 MPI ranks span more than one node (2 on this one)" in str(refused.value)
    assert "\n" not in str(refused.value)
    clean_env.setenv("MASTER_ADDR", "n0")
    assert DistEnv.detect().master_addr == "n0"


@pytest.mark.parametrize(
    "values",
    [
        {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"},
        {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"},
        {"PMI_RANK": "2", "PMI_SIZE": "4"},  # a PMI launcher without Hydra's local variables
    ],
    ids=["openmpi", "hydra", "pmi"],
)
@pytest.mark.parametrize(
    "outer",
    [
        # a batch script's own variables, passed on to everything it starts
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "7"},
        {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0"},  # a PyTorchJob's pod
    ],
    ids=["sbatch", "pytorchjob"],
)
def test_mpiexec_inside_another_launcher(
    clean_env: pytest.MonkeyPatch, values: dict[str, str], outer: dict[str, str]
) -> None:
    # mpiexec started this rank: its variables win over the ones every rank inherited
    _setenv(clean_env, {**outer, **values})
    env = DistEnv.detect()
    assert (env.rank, env.world_size, env.source) == (2, 4, "mpi")


def test_srun_with_pmi2_is_a_slurm_step(clean_env: pytest.MonkeyPatch) -> None:
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE to its own rank and task count (no Hydra locals):
    # SLURM's variables describe the same task and say more (node layout, address)
    _setenv(
        clean_env,
        {
            "PMI_RANK": "3",
            "PMI_SIZE": "4",
            "SLURM_PROCID": "3",
            "SLURM_NTASKS": "4",
            "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_LOCALID": "1",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "SLURM_STEP_NODELIST": "n[1-2]",
            "SLURM_JOB_ID": "42",
        },
    )
    env = DistEnv.detect()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.source, env.master_addr, env.master_port) == ("slurm", "n1", 20042)
    # rank 0 of an mpiexec in a batch script agrees with the script's SLURM_PROCID=0 too, but
    # the script has no SLURM_STEP_NUM_TASKS: it stays an MPI rank, like all its peers
    clean_env.delenv("SLURM_STEP_NUM_TASKS")
    clean_env.setenv("PMI_RANK", "0")
    clean_env.setenv("SLURM_PROCID", "0")
    assert DistEnv.detect().source == "mpi"


@pytest.mark.parametrize(
    ("values", "wrong"),
    [
        ({"RANK": "two", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, "RANK='two'"),
        (
            {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_PORT": "http"},
            "MASTER_PORT='http'",
        ),
        ({"RANK": "1", "WORLD_SIZE": "4x"}, "WORLD_SIZE='4x'"),  # Kubeflow
        ({"SLURM_PROCID": "", "SLURM_NTASKS": "4"}, "SLURM_PROCID=''"),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "four"}, "SLURM_NTASKS='four'"),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "12a"}, "SLURM_JOB_ID='12a'"),
        (
            {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4.0"},
            "OMPI_COMM_WORLD_SIZE='4.0'",
        ),
        ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "-"}, "MPI_LOCALNRANKS='-'"),
    ],
)
def test_a_variable_that_is_not_an_integer(
    clean_env: pytest.MonkeyPatch, values: dict[str, str], wrong: str
) -> None:
    _setenv(clean_env, values)
    with pytest.raises(TetherError) as refused:
        DistEnv.detect()
    message = str(refused.value)
    assert message.startswith(f"{wrong} is not an integer") and "\n" not in message


def test_a_local_world_size_that_is_not_an_integer(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCAL_WORLD_SIZE", "2 nodes")
    with pytest.raises(TetherError, match="LOCAL_WORLD_SIZE='2 nodes' is not an integer"):
        launcher_local_world_size()


def test_a_lone_process(clean_env: pytest.MonkeyPatch) -> None:
    env = DistEnv.detect()
    assert (env.rank, env.world_size, env.source) == (0, 1, "none")


def test_first_host_of_a_node_list() -> None:
    assert first_host("node[01-04,07],gpu1") == "node01"
    assert first_host("n[3-5]") == "n3"
    assert first_host("host1,host2") == "host1"
    assert first_host("single") == "single"
    assert first_host("") == "127.0.0.1"
    # several bracket groups in one name; names with brackets among others
    assert first_host("rack[1-2]-node[01-02]") == "rack1-node01"
    assert first_host("a[1-3,5],b7") == "a1"
    assert first_host("gpu-[007-010]x[2,4],cpu[1-2]") == "gpu-007x2"
    assert first_host("b7,a[1-3]") == "b7"


def test_where_a_parameter_server_listens(clean_env: pytest.MonkeyPatch) -> None:
    assert server_wire_address(DistEnv.read()) == "127.0.0.1"  # a local run: loopback
    clean_env.setenv("MASTER_ADDR", "10.0.0.1")  # rank 0's node under torchrun
    assert server_wire_address(DistEnv.read()) == "10.0.0.1"
    clean_env.setenv("TETHER_SERVER_ADDR", "10.0.1.7")  # the user's choice wins
    assert server_wire_address(DistEnv.read()) == "10.0.1.7"
