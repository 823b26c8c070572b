"""Launch N local worker processes through torch's elastic launcher (the engine behind torchrun).

We do not invent a rendezvous: the c10d rendezvous of ``torch.distributed.launcher`` runs on
127.0.0.1 with a free port, with no restarts, so a failed worker fails the run at once. The agent
watches the workers; when one dies it stops the others and reports which rank failed and why.

Methods that tolerate the loss of a worker (asynchronous parameter servers) are launched with a
program entry point instead of a function: each agent slot runs :mod:`tether.launch.supervise`,
which runs the worker as its child and hides the death of a worker rank from the agent (recording
it in ``RUN/lost/``), so the server and the other workers finish the run.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from tether.config import TrainConfig
from tether.errors import WorkerFailure
from tether.launch import loopback
from tether.launch.env import (
    prepare_local_environment,
    set_launcher_method,
    set_launcher_reports_errors,
)
from tether.launch.exits import stopped
from tether.launch.failure_report import describe_failures
from tether.launch.lost import (
    LOST_DIR,
    add_earlier_to_summary,
    failures_text,
    merge_into_summary,
    read_earlier_records,
    read_lost_records,
    set_aside_earlier,
)
from tether.launch.supervise import SCRIPT_STOP_GRACE_S
from tether.observe.files import atomic_write_json, atomic_write_text
from tether.observe.timeline import merge_after_run

LAUNCH_CONFIG = "config.launch.toml"  # the resolved config, read by each supervised worker


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def local_launch_config(processes: int, name: str, monitor_s: float = 0.2) -> LaunchConfig:
    """One node of ``processes`` workers under torch's elastic agent: c10d rendezvous on
    127.0.0.1 at a free port, no restarts (a failed worker fails the run at once), spawned
    processes. Also sets up the local environment and quiets the agent's logging."""
    prepare_local_environment()
    loopback.register()
    # The agent logs every state change and each failure's traceback; we report failures in one
    # line per rank and keep the tracebacks in the run directory instead.
    quiet = ("torch.distributed.elastic", "torch.multiprocessing")
    # Its modules' loggers carry their own level, so the parents' does not reach them.
    names = [n for n in logging.root.manager.loggerDict if n.startswith(quiet)]
    for logger in (*quiet, *names):
        logging.getLogger(logger).setLevel(logging.CRITICAL)
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=processes,
        run_id=f"{name}-{uuid.uuid4().hex[:8]}",
        rdzv_backend=loopback.BACKEND,  # c10d's, its stores listening on 127.0.0.1 only
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=monitor_s,
        start_method="spawn",
        local_addr="127.0.0.1",
    )


def launch_local(
    config: TrainConfig,
    processes: int,
    worker: Callable[..., None],
    worker_module: str,
    extra_args: tuple[str, ...] = (),
    tolerant: bool = False,
    servers: int = 0,
) -> None:
    """Run ``worker(config_toml, *extra_args)`` in ``processes`` local worker processes; raise
    WorkerFailure on error (the first ``servers`` ranks named as the method's server).

    ``tolerant`` (a method that carries on without a lost worker): a worker rank other than 0
    may die without ending the run; each rank then runs ``python -m worker_module CONFIG_FILE
    *extra_args`` under the supervisor, and the run directory records the loss
    (``summary.json`` ``lost_workers``, ``lost/``).
    """
    launch = local_launch_config(processes, "tether")
    run_dir = Path(config.out) if config.out else None
    marks = Path(tempfile.mkdtemp(prefix="tether-ranks-"))
    try:
        with loopback.stores_of_a_launch():
            if run_dir is not None:
                _launch_supervised(
                    launch, config, run_dir, worker_module, extra_args, tolerant, marks
                )
            else:
                elastic_launch(launch, worker)(config.to_toml(), *extra_args)
    except ChildFailedError as error:
        log = run_dir / "failures.log" if run_dir is not None else None
        message, ranks = describe_failures(error, log, marks, servers)
        if tolerant and run_dir is not None:
            lost_records = read_earlier_records(run_dir) + read_lost_records(run_dir)
            _append(run_dir / "failures.log", failures_text(lost_records))
        raise WorkerFailure(message, ranks) from None
    except SignalException as stop:  # we were told to stop (Ctrl-C, kill): so were the ranks
        raise stopped(stop) from None
    finally:
        shutil.rmtree(marks, ignore_errors=True)
        if config.timeline and run_dir is not None:
            merge_after_run(run_dir)
    if tolerant and run_dir is not None:
        _record_lost_workers(run_dir)


def _launch_supervised(
    launch: LaunchConfig,
    config: TrainConfig,
    run_dir: Path,
    worker_module: str,
    extra_args: tuple[str, ...],
    tolerant: bool,
    marks: Path,
) -> None:
    """Each rank under the supervisor (see :mod:`tether.launch.supervise`): ``tolerant``, a
    worker may be lost; always, a stop reaches a stopped or blocked worker, and ``marks``
    records which ranks were stopped or still at work when the run was stopped."""
    lost = run_dir / LOST_DIR
    set_aside_earlier(run_dir, config.resume)
    config_path = run_dir / LAUNCH_CONFIG
    atomic_write_text(config_path, config.to_toml())
    python = sys.executable
    worker = [python, "-m", worker_module, str(config_path), *extra_args]
    elastic_launch(launch, python)(*_supervised(marks, lost if tolerant else None), *worker)


def _supervised(marks: Path, lost: Path | None, stop_grace_s: float | None = None) -> list[str]:
    """The arguments before a rank's command that run it under the supervisor
    (:mod:`tether.launch.supervise`): ``marks`` for the ranks found stopped or still at work
    when the run was stopped, ``lost`` (a method that carries on) for the lost workers'
    records, ``stop_grace_s`` how long a rank may take to end once told to stop."""
    arguments = ["-m", "tether.launch.supervise", "--marks-dir", str(marks)]
    if stop_grace_s is not None:
        arguments += ["--stop-grace", str(stop_grace_s)]
    return arguments + (["--lost-dir", str(lost)] if lost is not None else []) + ["--"]


def launch_script(
    command: list[str],
    processes: int,
    tolerant: bool = False,
    method: str | None = None,
    servers: int = 0,
) -> None:
    """Run a user's program (``[script.py, args...]`` for this Python) in ``processes`` local
    processes under the same agent and supervisor as ``tether train`` (``tether launch``);
    raise WorkerFailure when one fails. As in a training run, a stopped (SIGSTOP) or hung rank
    is stopped within seconds and named first; ``tolerant``: a worker rank other than 0 may
    die and the others carry on (its record stays in a ``tether-lost-*`` directory under the
    system's temporary one, which the supervisor's message names). ``method`` is what
    ``tether.init()`` in the script uses when it names none, and has ``servers`` server ranks
    (named so in a failure's report). A script's uncaught exception after ``tether.init``
    reaches the report in one line (its error file: see
    :func:`tether.launch.error_file.record_uncaught_errors`); one of Tether's own one-line errors
    is not printed by each rank as well."""
    if method is not None:
        set_launcher_method(method)
    set_launcher_reports_errors()
    launch = local_launch_config(processes, "tether-launch")
    python = sys.executable
    marks = Path(tempfile.mkdtemp(prefix="tether-ranks-"))
    lost = Path(tempfile.mkdtemp(prefix="tether-lost-")) if tolerant else None
    try:
        with loopback.stores_of_a_launch():
            supervise = _supervised(marks, lost, SCRIPT_STOP_GRACE_S)  # a script may save
            elastic_launch(launch, python)(*supervise, python, *command)
    except ChildFailedError as error:
        message, ranks = describe_failures(error, None, marks, servers)
        raise WorkerFailure(message, ranks) from None
    except SignalException as stop:
        raise stopped(stop) from None
    finally:
        shutil.rmtree(marks, ignore_errors=True)
        if lost is not None and not any(lost.glob("rank-*.json")):  # kept: a worker was lost
            shutil.rmtree(lost, ignore_errors=True)


def _append(log: Path, text: str) -> None:
    if text:
        with log.open("a") as handle:
            handle.write(text)


def _record_lost_workers(run_dir: Path) -> None:
    """After a run that carried on: how each lost worker ended goes into summary.json, and its
    traceback into failures.log; after a resume, those of the attempts before it too. With
    none, ``lost/`` held only the supervisors' marks while the run lasted: it goes."""
    records, earlier = read_lost_records(run_dir), read_earlier_records(run_dir)
    if not records and not earlier:
        shutil.rmtree(run_dir / LOST_DIR, ignore_errors=True)
        return
    (run_dir / "failures.log").write_text(failures_text(earlier + records))
    path = run_dir / "summary.json"
    if path.exists():
        summary = json.loads(path.read_text())
        merge_into_summary(summary, records)
        if earlier:
            add_earlier_to_summary(summary, earlier)
        atomic_write_json(path, summary)
