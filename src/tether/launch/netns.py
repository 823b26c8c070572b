"""An emulated cluster on one Linux machine: network namespaces as nodes, veth links, a bridge.

Multi-node code paths (a rendezvous across machines, gloo bound to a named interface, collectives
whose slow links are between nodes) cannot be tested with every process on loopback. Each "node"
here is a network namespace with its own loopback and one veth link to a "switch" namespace that
holds a Linux bridge, so the host's own network is never touched and concurrent clusters cannot
see each other (their addresses may therefore repeat). Processes run inside a node with
``ip netns exec``; everything else (file system, hostname, processes) stays shared, which is what
lets one ``torchrun`` per node form one job.

Shaping. With ``link_mbit`` each node's link gets a token-bucket filter (``tc qdisc ... tbf``) on
BOTH veth ends: the node end's egress shapes what the node sends, the switch end's egress what it
receives, like a full-duplex NIC. Traffic between processes of one node goes through the node's
loopback and stays unshaped. (netem, for delay and loss, is not available on these machines.)
The tbf parameters, chosen so that large transfers really run at the rate:

* ``burst`` (bucket size) = max(128 KiB, 2 ms at the rate). veth hands the qdisc GSO packets of
  up to 64 KiB; a bucket smaller than a packet makes tbf split every packet (costly), and a bucket
  of only a few packets lets timer slack leave the link idle, so the measured rate falls short.
  The bucket is also the most a link can send above the rate after an idle spell: 128 KiB is
  10 ms at 100 Mbit/s and 1 ms at 1 Gbit/s, negligible against transfers of megabytes.
* ``latency`` = the time the link needs for 256 KiB (a few GSO packets), at least 2 ms: 2 ms at
  1 Gbit/s, 21 ms at 100 Mbit/s; the queue holds rate x latency + burst bytes. A queue of fewer
  packets drops so often that TCP stalls (at 100 Mbit/s a 2 ms queue made a test job time out);
  a deep one halves a TCP connection that carries data both ways at once (what gloo does for a
  pairwise exchange), as each direction's ACKs wait behind the other direction's queued data.
  Measured over 1 Gbit/s, 16 MB each way on one connection: 278 ms with a 20 ms queue, 140 ms
  with 2 ms (one way alone: 139 ms).

Names include the creating process's pid and a counter (``tether-PID-K-n0``, ``tether-PID-K-sw``),
so concurrent test runs never clash; :func:`cleanup_stale` removes the namespaces of dead pids
(a run killed before its teardown). Root, ``ip`` and ``tc`` are needed: :func:`available` says
why not when they are missing.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import math
import os
import re
import shutil
import signal
import subprocess
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tether.errors import TetherError
from tether.launch.proctree import kill_tree

PREFIX = "tether-"
# tether-PID-K-nI (node I of this process's K-th cluster), tether-PID-K-sw, tether-PID-probe
_NAME = re.compile(r"^tether-(\d+)-(?:\d+-(?:n\d+|sw)|probe)$")
_COMMAND_TIMEOUT = 20.0  # seconds for one ip/tc command; they take milliseconds
# ``ip netns exec NS`` bind-mounts the files of /etc/netns/NS over /etc: each node gets a hosts file
# naming every node, so reverse lookups of node addresses (c10d logs the peer's name) answer at
# once instead of failing on a name server the node cannot reach.
NETNS_ETC = Path("/etc/netns")
_counter = itertools.count()
_open: weakref.WeakSet[EmulatedCluster] = weakref.WeakSet()


class NetnsError(TetherError):
    """Setting up, using or tearing down an emulated cluster failed."""


QUEUE_BYTES = 256 * 1024


def tbf_parameters(link_mbit: float) -> tuple[int, int]:
    """``(burst_bytes, latency_ms)`` of the token bucket for a link of ``link_mbit`` Mbit/s
    (why these values: the module docstring)."""
    rate_bytes_per_s = link_mbit * 1e6 / 8
    burst = max(128 * 1024, int(rate_bytes_per_s * 0.002))
    latency_ms = max(2, math.ceil(QUEUE_BYTES / rate_bytes_per_s * 1000))
    return burst, latency_ms


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """Run ``ip`` (or ``tc`` when args start with "tc"), in ``netns`` if given; stdout."""
    tool, rest = ("tc", args[1:]) if args and args[0] == "tc" else ("ip", args)
    argv = [tool, *(("-n", netns) if netns else ()), *rest]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv)}: {exc}") from None
    if check and done.returncode != 0:
        detail = (done.stderr.strip() or f"exit code {done.returncode}").splitlines()[0]
        raise NetnsError(f"{' '.join(argv)}: {detail}")
    return done.stdout


@functools.cache
def available() -> str | None:
    """None when emulated clusters work here, else the reason they do not (for a test skip).

    Checked by doing it: a probe namespace with a bridge, a veth pair and a tbf qdisc, removed
    again. Cached: the answer does not change while the process runs."""
    if os.geteuid() != 0:
        return "emulated clusters need root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"emulated clusters need the {tool!r} command (iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except NetnsError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _ip("link", "add", "br0", "type", "bridge", netns=probe)
        _ip("link", "add", "port0", "type", "veth", "peer", "name", "veth0", netns=probe)
        _ip("link", "set", "port0", "master", "br0", netns=probe)
        burst, latency = tbf_parameters(100)
        _ip("tc", "qdisc", "add", "dev", "veth0", "root", "tbf", "rate", "100mbit",
            "burst", str(burst), "latency", f"{latency}ms", netns=probe)  # fmt: skip
    except NetnsError as exc:
        return f"cannot build a bridged, tbf-shaped veth link: {exc}"
    finally:
        _ip("netns", "delete", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(netns: str) -> None:
    """SIGKILL every process still inside ``netns`` (stray workers a killed launcher left)."""
    for pid in _ip("netns", "pids", netns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _delete_namespace(netns: str) -> None:
    _kill_namespace_processes(netns)
    _ip("netns", "delete", netns, check=False)
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)


def our_namespaces() -> list[str]:
    """Names of all namespaces made by this module (any process) that still exist."""
    names = [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]
    return [name for name in names if _NAME.match(name)]


def cleanup_stale() -> list[str]:
    """Delete the namespaces whose creating process is dead (a run killed before its teardown,
    which would otherwise leak them until reboot); returns their names. Live pids' are kept."""
    stale = []
    for name in our_namespaces():
        match = _NAME.match(name)
        if match and not _pid_alive(int(match.group(1))):
            _delete_namespace(name)
            stale.append(name)
    return stale


class EmulatedCluster:
    """``nodes`` network namespaces joined by veth links through a bridge; a context manager.

    Node i has address ``10.SUBNET.0.(i+1)/24`` on interface :meth:`interface` (use it as
    GLOO_SOCKET_IFNAME). ``link_mbit`` shapes every node's link in both directions (see the
    module docstring); None leaves the veths unshaped. Teardown kills the processes started
    in the nodes and deletes every namespace, also when setup or the ``with`` body fails.
    """

    def __init__(self, nodes: int = 2, link_mbit: float | None = None, subnet: int = 77) -> None:
        if not 1 <= nodes <= 200:
            raise NetnsError(f"an emulated cluster has 1 to 200 nodes, not {nodes}")
        if link_mbit is not None and link_mbit <= 0:
            raise NetnsError(f"link_mbit must be positive, not {link_mbit}")
        if not 0 <= subnet <= 255:
            raise NetnsError(f"subnet must be 0 to 255 (10.SUBNET.0.0/24), not {subnet}")
        self.nodes = nodes
        self.link_mbit = link_mbit
        self.subnet = subnet
        base = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.switch = f"{base}-sw"
        self.namespaces = [f"{base}-n{i}" for i in range(nodes)]
        self._processes: list[subprocess.Popen[str]] = []
        self._created: list[str] = []

    # -- placement -----------------------------------------------------------------------
    def address(self, i: int) -> str:
        """Node i's IPv4 address, reachable from every other node."""
        return f"10.{self.subnet}.0.{self._node(i) + 1}"

    def interface(self, i: int) -> str:
        """The name of node i's veth end inside its namespace (for GLOO_SOCKET_IFNAME)."""
        return f"veth{self._node(i)}"

    def hostname(self, i: int) -> str:
        """A name for node i's address, resolvable inside every node (not on the host)."""
        return f"node{self._node(i)}"

    def namespace(self, i: int) -> str:
        return self.namespaces[self._node(i)]

    def _node(self, i: int) -> int:
        if not 0 <= i < self.nodes:
            raise NetnsError(f"node {i} is not in a cluster of {self.nodes} nodes")
        return i

    # -- lifetime ------------------------------------------------------------------------
    def __enter__(self) -> EmulatedCluster:
        reason = available()
        if reason is not None:
            raise NetnsError(reason)
        cleanup_stale()
        _open.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _build(self) -> None:
        sw = self.switch
        for netns in (sw, *self.namespaces):
            _ip("netns", "add", netns)
            self._created.append(netns)
            _ip("link", "set", "lo", "up", netns=netns)
        _ip("link", "add", "br0", "type", "bridge", netns=sw)
        _ip("link", "set", "br0", "up", netns=sw)
        for i, node in enumerate(self.namespaces):
            port, veth = f"port{i}", self.interface(i)
            _ip("link", "add", port, "type", "veth", "peer", "name", veth, "netns", node, netns=sw)
            _ip("link", "set", port, "master", "br0", netns=sw)
            _ip("addr", "add", f"{self.address(i)}/24", "dev", veth, netns=node)
            if self.link_mbit is not None:
                self._shape(sw, port)
                self._shape(node, veth)
            _ip("link", "set", port, "up", netns=sw)
            _ip("link", "set", veth, "up", netns=node)
        self._write_hosts()

    def _write_hosts(self) -> None:
        try:
            base = Path("/etc/hosts").read_text()
        except OSError:
            base = "127.0.0.1 localhost\n"
        # Also the IPv4-mapped IPv6 form: the rendezvous store listens on a dual-stack socket and
        # looks its clients up by that form.
        names = "".join(
            f"{self.address(i)} {self.hostname(i)}\n::ffff:{self.address(i)} {self.hostname(i)}\n"
            for i in range(self.nodes)
        )
        text = f"{base.rstrip()}\n# tether emulated cluster\n{names}"
        for node in self.namespaces:
            # Best effort: without it (read-only /etc) only the lookups fail, with a log warning.
            with contextlib.suppress(OSError):
                (NETNS_ETC / node).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / node / "hosts").write_text(text)

    def _shape(self, netns: str, dev: str) -> None:
        assert self.link_mbit is not None
        burst, latency = tbf_parameters(self.link_mbit)
        rate = f"{int(self.link_mbit * 1000)}kbit"
        _ip("tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
            "burst", str(burst), "latency", f"{latency}ms", netns=netns)  # fmt: skip

    def close(self) -> None:
        """Kill every process started in the nodes, then delete the namespaces (which removes
        their veth ends and the bridge). Idempotent."""
        for proc in self._processes:
            if proc.poll() is None:
                kill_tree(proc.pid)
        for proc in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._processes.clear()
        for netns in reversed(self._created):
            _delete_namespace(netns)
        self._created.clear()
        _open.discard(self)

    # -- processes -----------------------------------------------------------------------
    def popen(
        self,
        i: int,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[str]:
        """Start ``argv`` inside node i (text mode; other Popen arguments pass through).

        ``env`` is added to this process's environment. The process gets a session of its own and
        is killed with its whole tree at teardown if it still runs."""
        if not self._created:
            raise NetnsError("the cluster is not set up: use it as a context manager")
        full_env = {**os.environ, **(env or {})}
        proc: subprocess.Popen[str] = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace(i), *argv],
            env=full_env,
            text=True,
            start_new_session=True,
            **kwargs,
        )
        self._processes.append(proc)
        return proc

    def run(
        self,
        i: int,
        argv: Sequence[str],
        timeout: float,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside node i to completion; stdout and stderr are captured.

        Past ``timeout`` seconds the process and all its descendants are killed and
        ``subprocess.TimeoutExpired`` is raised, carrying what they had printed."""
        proc = self.popen(
            i,
            argv,
            env=env,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@atexit.register
def _close_open_clusters() -> None:
    """A cluster left open (no ``with``, an interpreter exiting on an error) is torn down."""
    for cluster in list(_open):
        cluster.close()
