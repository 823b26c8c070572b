"""Launch N local worker processes through torch's elastic launcher (the engine behind torchrun).

We do not invent a rendezvous: the c10d rendezvous of ``torch.distributed.launcher`` runs on
127.0.0.1 with a free port, with no restarts, so a failed worker fails the run at once. The agent
watches the workers; when one dies it stops the others and reports which rank failed and why.
"""

from __future__ import annotations

import logging
import socket
import uuid

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from tether.config import TrainConfig
from tether.errors import WorkerFailure
from tether.launch.env import prepare_local_environment
from tether.launch.worker import run_worker


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def describe_failures(error: ChildFailedError) -> tuple[str, list[int]]:
    """One line per failed rank: its error message, or how it died (exit code or signal)."""
    lines, ranks = [], []
    for rank, failure in sorted(error.failures.items()):
        ranks.append(rank)
        message = failure.message
        if isinstance(message, dict):
            message = message.get("message", "")
        text = str(message).strip().splitlines()
        reason = text[0] if text else ""
        if (failure.signal_name() != "<N/A>" and not reason.strip()) or "Signal" in reason:
            reason = f"killed by {failure.signal_name()}"
        elif not reason or reason.startswith("To enable traceback"):
            reason = f"exited with code {failure.exitcode}"
        lines.append(f"worker rank {rank} failed: {reason}")
    return "; ".join(lines), ranks


def launch_local(config: TrainConfig, processes: int) -> None:
    """Run the training job in ``processes`` local worker processes; raise WorkerFailure on error."""
    prepare_local_environment()
    # The agent logs every state change at INFO/WARNING; our own progress and summary say enough.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=processes,
        run_id=f"tether-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=0.2,
        start_method="spawn",
        local_addr="127.0.0.1",
    )
    try:
        elastic_launch(launch, run_worker)(config.to_toml())
    except ChildFailedError as error:
        message, ranks = describe_failures(error)
        raise WorkerFailure(message, ranks) from None
