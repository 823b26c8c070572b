"""The one-line report of a failed launch: which rank failed and why, the cause first.

When one rank of a synchronous run dies, its peers fail too, each with its transport's account of
the lost connection (gloo's "Read error ... Connection reset by peer. This is typically caused by
a remote worker hanging ...", a socket wire's "closed its connection", a timeout), and the agent
stops whatever still runs with SIGTERM. Listed by rank, the rank that caused it could sit in the
middle of that text. The report puts first the ranks that stopped answering (the supervisors'
marks), then the ranks that failed on their own (an exception, a kill), then those that failed
because a peer did, each reason without the transport's source path and boilerplate; the full
tracebacks go to the run's ``failures.log``.
"""

from __future__ import annotations

import re
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from tether.launch.lost import CAUSE_MARK, describe_exit

# What a rank says when a transport's wait for a peer ran out: gloo's, a store's, NCCL's
# watchdog, our wire's and our collectives' (not any "timed out", which a user's own code says)
_WAITED = (
    "timed out waiting",
    "wait timeout",
    "watchdog caught collective operation timeout",
    "sent nothing for",
    "read nothing for",
    "gave up",
)
# What a rank says when it failed because a peer did: it lost the connection or waited in vain.
_PEER_CAUSED = (
    *_WAITED,
    "connection reset by peer",
    "connection closed by peer",
    "connection refused",
    "closed its connection",
    "the connection to ",
    "broken pipe",
    "remote process exited",  # NCCL
    "communicator was aborted",  # NCCL
    "timed out",
    "timeout",
    # the agent stopping the ranks still running after a failure (a SIGTERM from outside reads
    # the same to the agent: its supervisor's cause mark puts that rank first)
    "killed by sigterm",
)
_SOURCE_PATH = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|h):\d+\]\s*")  # gloo's "[/path/pair.cc:537] "
_BOILERPLATE = ". This is typically caused by"  # gloo's advice after the reason


def _reason(failure: ProcessFailure) -> str:
    """The first line of the worker's exception, or how the process died."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    lines = str(message).strip().splitlines()
    # An exception recorded by the worker explains more than the signal that ended the process
    # (a process can abort while shutting down after the error).
    if lines and not lines[0].startswith(("To enable traceback", "Signal")):
        return short_reason(lines[0])
    if failure.exitcode is None:
        return "exited with code None"
    return describe_exit(failure.exitcode)


def short_reason(reason: str) -> str:
    """``reason`` without a C++ source path and gloo's advice after it."""
    reason = _SOURCE_PATH.sub("", reason)
    cut = reason.find(_BOILERPLATE)
    return reason[:cut] if cut > 0 else reason


def caused_by_a_peer(reason: str) -> bool:
    """Whether a failed rank's reason says it lost a peer or waited for one in vain."""
    text = reason.lower()
    return any(marker in text for marker in _PEER_CAUSED)


def _gave_up(reason: str) -> bool:
    """Whether a failed rank's reason says it waited for a peer until its transport's timeout."""
    text = reason.lower()
    return any(marker in text for marker in _WAITED)


def _alike_together(ranks: list[int], reasons: dict[int, str], servers: int) -> list[str]:
    """One clause per reason: the workers that failed alike named together ("worker ranks 1, 2
    and 3 failed: X", a script that fails the same way everywhere), in the order of their
    first rank; a server apart."""
    groups: dict[tuple[bool, str], list[int]] = {}
    for rank in ranks:
        groups.setdefault((rank < servers, reasons[rank]), []).append(rank)
    clauses = []
    for (_, reason), alike in groups.items():
        if len(alike) == 1:
            clauses.append(f"{rank_name(alike[0], servers)} failed: {reason}")
        else:
            listed = ", ".join(str(r) for r in alike[:-1]) + f" and {alike[-1]}"
            clauses.append(f"worker ranks {listed} failed: {reason}")
    return clauses


def rank_name(rank: int, servers: int = 0) -> str:
    """How a report names a rank: the first ``servers`` ranks are a parameter server's."""
    return f"{'server' if rank < servers else 'worker'} rank {rank}"


def unanswering_ranks(marks: Path | None, waited: bool, servers: int = 0) -> dict[int, str]:
    """What the supervisors' marks say, by rank: a stopped (SIGSTOP) rank stopped answering; one
    still running when the run was stopped did, if the failed ranks gave up waiting
    (``waited``: a timeout; after an exception the healthy ranks are running too)."""
    if marks is None or not marks.is_dir():
        return {}
    states = [("stopped", "was stopped (SIGSTOP) and stopped answering")]
    if waited:
        states.append(("running", "did not fail itself and stopped answering (hung?)"))
    said: dict[int, str] = {}
    for state, how in states:
        for path in marks.glob(f"{state}-rank-*"):
            rank = int(path.name.rsplit("-", 1)[1])
            said.setdefault(rank, f"{rank_name(rank, servers)} {how}")
    return said


def supervisors_causes(marks: Path | None, servers: int = 0) -> dict[int, str]:
    """The ranks whose supervisors said why they ended (a server killed for hanging, a rank
    killed by a SIGTERM the launcher did not send), each with what it said."""
    said: dict[int, str] = {}
    for path in marks.glob(f"{CAUSE_MARK}*") if marks is not None else ():
        try:
            rank = int(path.name.rsplit("-", 1)[1])
            said[rank] = f"{rank_name(rank, servers)} {path.read_text().strip()}"
        except (OSError, ValueError):
            continue
    return said


def _traceback(failure: ProcessFailure) -> str:
    data = failure.error_file_data or {}
    info = data.get("message", {})
    if isinstance(info, dict):
        return str(info.get("extraInfo", {}).get("py_callstack", info.get("message", "")))
    return str(info)


def describe_failures(
    error: ChildFailedError, log: Path | None, marks: Path | None = None, servers: int = 0
) -> tuple[str, list[int]]:
    """One clause per failed rank, the cause first (module docstring); full tracebacks go to
    ``log`` (the run's failures.log). The ranks the supervisors found stopped (SIGSTOP) or still
    at work when the run was stopped (``marks``) are said so, instead of "killed by SIGTERM":
    they stopped answering, the other failed ranks gave up waiting for them. The first
    ``servers`` ranks are named as the parameter server they are, not as workers. Returns the
    message and the failed ranks in rank order."""
    reasons = {rank: _reason(failure) for rank, failure in error.failures.items()}
    by_peer = {rank: caused_by_a_peer(reason) for rank, reason in reasons.items()}
    # Ranks still at work when the run was stopped stopped answering only if the failed ones
    # gave up waiting, and none failed on its own (after a kill, the healthy ranks are at work).
    waited = any(_gave_up(reason) for reason in reasons.values()) and all(by_peer.values())
    silent = {
        rank: text
        for rank, text in unanswering_ranks(marks, waited, servers).items()
        # A rank that recorded its own error was at work on its way out, not silent.
        if rank not in reasons or reasons[rank].startswith("killed by")
    }
    silent.update(supervisors_causes(marks, servers))
    own: list[int] = []
    consequences: list[int] = []
    details: list[str] = []
    ranks: list[int] = []
    for rank, failure in sorted(error.failures.items()):
        ranks.append(rank)
        if rank not in silent:
            (consequences if by_peer[rank] else own).append(rank)
        details.append(
            f"== {rank_name(rank, servers)} ==\n{_traceback(failure) or reasons[rank]}\n"
        )
    lines = [text for _, text in sorted(silent.items())]
    lines += _alike_together(own, reasons, servers) + _alike_together(
        consequences, reasons, servers
    )
    message = "; ".join(lines)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("\n".join(details))
        message += f" (traceback in {log})"
    return message, ranks
