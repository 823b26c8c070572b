"""Throughput of an emulated cluster's links: one TCP transfer between two nodes.

A functional check that shaping is in effect (tests) and a way to measure what a link really
carries, independent of gloo. Two small Python programs, a receiver and a sender, run inside the
nodes with ``ip netns exec``.
"""

from __future__ import annotations

import subprocess
import sys
import time

from tether.launch.netns import EmulatedCluster, NetnsError
from tether.launch.proctree import kill_tree


def tcp_transfer(
    cluster: EmulatedCluster, src: int, dst: int, nbytes: int, timeout: float = 60.0
) -> float:
    """Seconds to send ``nbytes`` over one TCP connection from node ``src`` to node ``dst``,
    from connect until the receiver acknowledges the last byte (so bytes still queued in a
    socket buffer are not counted as delivered)."""
    receiver = cluster.popen(
        dst,
        [sys.executable, "-c", _RECEIVER, cluster.address(dst), str(nbytes)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + timeout
    try:
        assert receiver.stdout is not None
        port = receiver.stdout.readline().strip()  # the receiver listens before printing
        if not port.isdigit():
            detail = receiver.stderr.read() if receiver.stderr else ""
            raise NetnsError(f"TCP receiver in node {dst} failed: {detail.strip()!r}")
        sent = cluster.run(
            src,
            [sys.executable, "-c", _SENDER, cluster.address(dst), port, str(nbytes)],
            timeout=max(1.0, deadline - time.monotonic()),
        )
        if sent.returncode != 0:
            detail = (sent.stderr.strip().splitlines() or ["no output"])[-1]
            raise NetnsError(f"TCP sender in node {src} failed: {detail}")
        return float(sent.stdout.strip())
    finally:
        if receiver.poll() is None:
            kill_tree(receiver.pid)
        receiver.wait()


_RECEIVER = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
left = int(sys.argv[2])
while left > 0:
    chunk = conn.recv(min(left, 1 << 20))
    if not chunk:
        sys.exit("connection closed early")
    left -= len(chunk)
conn.sendall(b"k")
"""

_SENDER = """
import socket, sys, time
data = b"x" * int(sys.argv[3])
start = time.perf_counter()
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
conn.sendall(data)
if conn.recv(1) != b"k":
    sys.exit("no acknowledgement")
print(time.perf_counter() - start)
"""
