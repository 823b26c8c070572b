"""The launcher's one-line failure report (tether.launch.failure_report): the rank that caused a
failure comes first, its peers' lost connections after it, without gloo's source paths."""

from __future__ import annotations

import json
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from tether.launch.failure_report import caused_by_a_peer, describe_failures, short_reason

GLOO_RESET = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
    "Read error [127.0.0.1]:41171: Connection reset by peer. This is typically caused by a "
    "remote worker hanging or bugs in the application. Check the logs of the remote worker "
    "before reporting an error. GLHF!"
)


def _failure(tmp_path: Path, rank: int, message: str | None, exitcode: int = 1) -> ProcessFailure:
    """A rank's failure as the agent reads it: its error file holds ``message`` (None: no file,
    the process was killed)."""
    if message is None:
        return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file="")
    path = tmp_path / f"error-{rank}.json"
    path.write_text(
        json.dumps(
            {
                "message": {
                    "message": message,
                    "extraInfo": {"py_callstack": f"tb {rank}", "timestamp": "1"},
                }
            }
        )
    )
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=1, error_file=str(path))


def test_the_killed_rank_comes_before_the_peers_that_lost_it(tmp_path: Path) -> None:
    # sync-sgd with rank 1 killed: ranks 0 and 2 fail with gloo's reset, and rank 1's SIGKILL
    # used to sit between them, after 400 characters of gloo's advice.
    error = ChildFailedError(
        "worker",
        {
            0: _failure(tmp_path, 0, GLOO_RESET),
            1: _failure(tmp_path, 1, None, exitcode=-9),
            2: _failure(tmp_path, 2, GLOO_RESET.replace("41171", "47540")),
        },
    )
    message, ranks = describe_failures(error, tmp_path / "failures.log")
    assert message.startswith("worker rank 1 failed: killed by SIGKILL; worker rank 0 failed: ")
    assert (
        "worker rank 0 failed: RuntimeError: Read error [127.0.0.1]:41171: Connection " in message
    )
    assert "pair.cc" not in message and "typically caused" not in message
    assert message.index("worker rank 0") < message.index("worker rank 2")
    assert ranks == [0, 1, 2]
    log = (tmp_path / "failures.log").read_text()
    assert "== worker rank 1 ==" in log and "tb 0" in log  # the tracebacks kept in full


def test_an_exception_comes_before_timeouts_and_the_agents_sigterm(tmp_path: Path) -> None:
    error = ChildFailedError(
        "worker",
        {
            0: _failure(tmp_path, 0, "TimeoutError: rank 2 (channel 0) sent nothing for 10.0 s"),
            1: _failure(tmp_path, 1, None, exitcode=-15),
            2: _failure(tmp_path, 2, "RuntimeError: injected fault at step 20"),
            3: _failure(tmp_path, 3, "WireClosed: rank 0 (channel 0) closed its connection"),
        },
    )
    message, _ = describe_failures(error, None, servers=1)
    assert message.split("; ") == [
        "worker rank 2 failed: RuntimeError: injected fault at step 20",
        "server rank 0 failed: TimeoutError: rank 2 (channel 0) sent nothing for 10.0 s",
        "worker rank 1 failed: killed by SIGTERM",
        "worker rank 3 failed: WireClosed: rank 0 (channel 0) closed its connection",
    ]


def test_a_stopped_rank_comes_first_and_lost_connections_keep_rank_order(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "stopped-rank-2").touch()
    timeout = "RuntimeError: [/x/unbound_buffer.cc:78] Timed out waiting 10000ms for recv"
    error = ChildFailedError(
        "worker",
        {
            0: _failure(tmp_path, 0, timeout),
            1: _failure(tmp_path, 1, timeout),
            2: _failure(tmp_path, 2, None, exitcode=-9),
        },
    )
    message, _ = describe_failures(error, None, marks=marks)
    # the ranks that failed alike in one clause (it was one per rank, the same words repeated)
    assert message.split("; ") == [
        "worker rank 2 was stopped (SIGSTOP) and stopped answering",
        "worker ranks 0 and 1 failed: RuntimeError: Timed out waiting 10000ms for recv",
    ]


def test_a_script_that_fails_alike_everywhere_is_one_clause(tmp_path: Path) -> None:
    why = "TetherError: this model is split over its model group"
    error = ChildFailedError("worker", {rank: _failure(tmp_path, rank, why) for rank in range(4)})
    message, ranks = describe_failures(error, None, servers=1)
    assert message.split("; ") == [
        f"server rank 0 failed: {why}",
        f"worker ranks 1, 2 and 3 failed: {why}",
    ]
    assert ranks == [0, 1, 2, 3]


def test_what_counts_as_a_peers_doing() -> None:
    assert caused_by_a_peer(short_reason(GLOO_RESET))
    assert caused_by_a_peer("killed by SIGTERM")
    assert not caused_by_a_peer("killed by SIGKILL")
    assert not caused_by_a_peer("ValueError: the loss is NaN at step 3")
    assert not caused_by_a_peer("exited with code 1")
    assert short_reason("ValueError: [a] b. This is typically caused by") == "ValueError: [a] b"
    assert short_reason("no advice here") == "no advice here"


def test_ranks_at_work_are_not_called_hung_when_one_failed_on_its_own(tmp_path: Path) -> None:
    # sync-sgd on our ring, rank 1 killed: the ranks it was exchanging with gave up on it (our
    # collectives' "gave up"), those still computing were stopped by the agent: they were not
    # hung, and came first as "stopped answering (hung?)".
    marks = tmp_path / "marks"
    marks.mkdir()
    for rank in (2, 3):
        (marks / f"running-rank-{rank}").touch()
    stalled = "PeerStalled: ring schedule, rank 0: gave up receiving from rank 1 in round 1 of 6"
    error = ChildFailedError(
        "worker",
        {
            0: _failure(tmp_path, 0, stalled),
            1: _failure(tmp_path, 1, None, exitcode=-9),
            2: _failure(tmp_path, 2, None, exitcode=-15),
            3: _failure(tmp_path, 3, None, exitcode=-15),
        },
    )
    message, _ = describe_failures(error, None, marks=marks)
    assert message.startswith("worker rank 1 failed: killed by SIGKILL; "), message
    assert "hung" not in message and "stopped answering" not in message


def test_a_users_own_timeout_is_not_a_peer_given_up(tmp_path: Path) -> None:
    # A script's own "Read timed out" (a web request) is not a transport that waited for a
    # peer: the ranks the agent then stopped at work are not blamed as hung.
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "running-rank-0").touch()
    error = ChildFailedError(
        "worker",
        {
            0: _failure(tmp_path, 0, None, exitcode=-15),
            1: _failure(tmp_path, 1, "ReadTimeout: HTTPSConnectionPool: Read timed out."),
        },
    )
    message, _ = describe_failures(error, None, marks=marks)
    assert "hung" not in message, message
    assert "worker rank 1 failed: ReadTimeout" in message


def test_what_a_supervisor_said_comes_first(tmp_path: Path) -> None:
    # Rank 1 killed by a SIGTERM from outside read like the agent's stop of the healthy ranks,
    # and was listed after the rank that lost its connection to it.
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "cause-rank-1").write_text("failed: killed by SIGTERM, sent from outside the run")
    error = ChildFailedError(
        "worker",
        {0: _failure(tmp_path, 0, GLOO_RESET), 1: _failure(tmp_path, 1, None, exitcode=-15)},
    )
    message, ranks = describe_failures(error, None, marks=marks)
    assert (
        message.split("; ")[0]
        == "worker rank 1 failed: killed by SIGTERM, sent from outside the run"
    )
    assert message.split("; ")[1].startswith("worker rank 0 failed: RuntimeError: Read error")
    assert ranks == [0, 1]
