"""One ``torchrun`` job across the nodes of an :class:`~tether.launch.netns.EmulatedCluster`.

Every node runs the same torchrun command with a c10d rendezvous on node 0's address, exactly as
on a real cluster (README, "Processes and multi-node runs"), with two settings a real cluster gets
for free:

* ``--rdzv-conf is_host=1`` on node 0 and ``is_host=0`` elsewhere. torchrun decides who hosts the
  rendezvous store by comparing the endpoint with the machine's hostname and addresses; the
  namespaces share the host's hostname, which resolves to none of the 10.x addresses, so without
  this no agent would host the store and the rendezvous would never complete.
* ``--local-addr <node address>``: the address an agent advertises, which becomes the workers'
  MASTER_ADDR (the rank-0 agent's address). By default it is the shared hostname, which from
  another namespace does not reach node 0.

Each node's processes get ``GLOO_SOCKET_IFNAME`` = the node's veth (gloo then binds and connects
on the emulated network, never on loopback) and ``OMP_NUM_THREADS=1``. The c10d rendezvous sorts
the agents by address, so node ``i`` (of at most 9) gets group rank ``i``, and torchrun numbers the
workers contiguously per node: ``RANK = GROUP_RANK * G + LOCAL_RANK`` with
``LOCAL_WORLD_SIZE = G``, the layout hierarchical collectives rely on (tests/multinode checks it).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tether.launch.lost import describe_exit
from tether.launch.netns import EmulatedCluster, NetnsError
from tether.launch.proctree import kill_tree

RDZV_PORT = 29400  # free in every node: the namespaces are the cluster's own


@dataclass(frozen=True)
class NodeResult:
    node: int
    returncode: int | None  # None: killed by us (another node failed, or the timeout)
    output: str  # torchrun's and the workers' stdout and stderr, interleaved


@dataclass(frozen=True)
class TorchrunResult:
    nodes: tuple[NodeResult, ...]
    seconds: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(n.returncode == 0 for n in self.nodes)

    def failure(self) -> str | None:
        """One line saying what went wrong, or None when every node succeeded."""
        if self.timed_out:
            return f"torchrun job timed out after {self.seconds:.0f} s"
        failed = [n for n in self.nodes if n.returncode not in (0, None)]
        if not failed:
            return None
        return "; ".join(f"node {n.node} {describe_exit(n.returncode or 0)}" for n in failed)

    def output(self, tail: int | None = None) -> str:
        """Every node's output, each under a header (for a failing test's message); with
        ``tail``, only the last ``tail`` characters of each node's, so that the node whose
        error started the failure is not cut off by another node's long traceback."""
        return "\n".join(
            f"===== node {n.node} =====\n{n.output if tail is None else n.output[-tail:]}"
            for n in self.nodes
        )


def torchrun_argv(
    cluster: EmulatedCluster,
    node: int,
    nproc_per_node: int,
    target: Sequence[str],
    run_id: str,
    python: str | None = None,
) -> list[str]:
    """The torchrun command line of ``node``; ``target`` is a script and its arguments or
    ``["-m", module, *args]``."""
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={cluster.nodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={cluster.address(0)}:{RDZV_PORT}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf=is_host={1 if node == 0 else 0}",
        f"--local-addr={cluster.address(node)}",
        "--max-restarts=0",
        *target,
    ]


def torchrun_across(
    cluster: EmulatedCluster,
    nproc_per_node: int,
    target: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
) -> TorchrunResult:
    """Run one torchrun job with ``nproc_per_node`` workers in every node of ``cluster``.

    Fails fast: as soon as one node's torchrun exits non-zero, or ``timeout`` seconds pass, every
    node's process tree is killed (a node whose peer died would otherwise wait for the rendezvous
    or a collective timeout). ``env`` is added to every node's environment; each node also gets
    ``TETHER_NETNS_NODE`` = its index, for workers that report where they ran.
    """
    if nproc_per_node < 1:
        raise NetnsError(f"nproc_per_node must be at least 1, not {nproc_per_node}")
    if cluster.nodes > 9:
        # The rendezvous orders agents by address string: 10.x.0.10 would sort before 10.x.0.2.
        raise NetnsError(f"torchrun_across supports at most 9 nodes, not {cluster.nodes}")
    run_id = f"netns-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="tether-torchrun-") as logs:
        files = [open(Path(logs) / f"node{i}.log", "w+") for i in range(cluster.nodes)]  # noqa: SIM115
        procs: list[subprocess.Popen[str]] = []
        start = time.monotonic()
        try:
            for i in range(cluster.nodes):
                node_env = {
                    "GLOO_SOCKET_IFNAME": cluster.interface(i),
                    "OMP_NUM_THREADS": "1",
                    "PYTHONUNBUFFERED": "1",
                    "TETHER_NETNS_NODE": str(i),
                    **(env or {}),
                }
                argv = torchrun_argv(cluster, i, nproc_per_node, target, run_id, python)
                procs.append(
                    cluster.popen(
                        i,
                        argv,
                        env=node_env,
                        stdin=subprocess.DEVNULL,
                        stdout=files[i],
                        stderr=subprocess.STDOUT,
                    )
                )
            timed_out = _wait(procs, start + timeout)
            seconds = time.monotonic() - start
            codes: list[int | None] = []
            for proc in procs:
                if proc.poll() is None:
                    kill_tree(proc.pid)
                    proc.wait()
                    codes.append(None)
                else:
                    codes.append(proc.returncode)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    kill_tree(proc.pid)
                    proc.wait()
            outputs = []
            for f in files:
                f.seek(0)
                outputs.append(f.read())
                f.close()
    nodes = tuple(NodeResult(i, codes[i], outputs[i]) for i in range(cluster.nodes))
    return TorchrunResult(nodes, seconds, timed_out)


def _wait(procs: Sequence[subprocess.Popen[str]], deadline: float) -> bool:
    """Wait until all exit 0, one exits non-zero or the deadline passes; True on the deadline."""
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
            return False
        time.sleep(0.1)
    return True
