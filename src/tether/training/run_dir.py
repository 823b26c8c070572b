"""The run directory before a run starts: checked, and never damaged by a mistake.

Everything is validated before any file is touched: a directory that already holds something is
refused unless the run resumes it (``--resume``) or replaces it (``--overwrite``, which removes
Tether's own files only), a resumed run's checkpoint is read and checked here, in the launcher,
before any worker starts, and the directory must be writable. Files an interrupted atomic write
left behind (``.NAME.XXXX.tmp``) are removed.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tether.comm.header import MAX_STEP
from tether.config import TrainConfig
from tether.errors import TetherError
from tether.spelling import both_ways
from tether.training.checkpoint import CHECKPOINT_NAME, SHARDS_DIR
from tether.training.resumed_state import check_resumed_state
from tether.training.task import Task

# What a run (or a comparison) writes; --overwrite removes these and nothing else.
RUN_FILES = (
    "summary.json",
    "model.pt",
    "metrics.jsonl",
    "config.toml",
    "config.launch.toml",
    CHECKPOINT_NAME,
    "timeline.json",
    "failures.log",
    "injected_fault.txt",
    "mpi.log",
    "nodes.log",
    "compare.md",
    "compare.json",
    "compare.png",
)
RUN_DIRS = ("lost", "timeline", "tensorboard", SHARDS_DIR)
CHECKPOINT_KEYS = ("step", "model", "method", "history", "elapsed_s", "time_to_target_s")
# Methods whose run is defined by its global batch (workers x batch): another worker count would
# be another run. The EASGD family and the parameter-server methods restart every worker from the
# center instead, with any count.
SAME_GLOBAL_BATCH = ("sync-sgd", "local-sgd")


def prepare_run_dir(config: TrainConfig, overwrite: bool = False) -> Path:
    """Check ``config.out`` for this run and make it ready; raises TetherError (one line) before
    changing anything when it cannot be used. Its warnings (a resume at another global batch)
    are the caller's to say: tether train and tether.fit check the directory first, with the
    model, and say them once."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = check_run_dir(config, overwrite)
    if overwrite and not config.resume:
        remove_run_files(out)
    remove_stale_temporaries(out)
    return out


def check_run_dir(
    config: TrainConfig,
    overwrite: bool = False,
    model: nn.Module | None = None,
    task: Task | None = None,
) -> Path:
    """Every check of :func:`prepare_run_dir`, changing nothing but creating the directory;
    with ``model`` (the run's, unsharded), a resumed checkpoint's weights are checked against
    its parameters' names and shapes too, and with the ``task`` as well, the optimizer and
    schedule it builds against the checkpoint's (:mod:`tether.training.resumed_state`)."""
    if config.out is None or not str(config.out).strip():
        raise TetherError("--out is empty: name the run directory (e.g. --out runs/mine)")
    out = Path(config.out)
    if config.resume and overwrite:
        raise TetherError("resume and overwrite exclude each other: choose one")
    if out.exists() and not out.is_dir():
        raise TetherError(f"--out {out} is a file, not a directory: choose another --out")
    if config.resume:
        if not out.is_dir():  # (it told a missing directory to start again with --overwrite)
            raise TetherError(
                f"cannot resume {out}: no such directory; leave resume out to start a run there"
            )
        if not (out / CHECKPOINT_NAME).exists():
            why = (
                "it ended before its first checkpoint"
                if config.checkpoint_every
                else f"it saved none (a run saves one with, e.g., {both_ways(checkpoint_every=100)})"
            )
            raise TetherError(
                f"cannot resume {out}: it holds no {CHECKPOINT_NAME}, {why}; nothing was "
                f"changed: start it again with --overwrite (overwrite=True in Python)"
            )
        state = validate_checkpoint(out / CHECKPOINT_NAME, config)
        if model is not None:
            check_model_state(out / CHECKPOINT_NAME, state["model"], model)
            if task is not None:
                check_resumed_state(out, state, config, task, model)
    elif out.exists() and any(out.iterdir()) and not overwrite:
        what = "holds a run" if holds_run(out) else "is not empty"
        raise TetherError(
            f"--out {out} {what}: choose another --out, continue it with --resume {out}, or "
            "replace it with --overwrite (tether.fit: out=, resume=True, overwrite=True)"
        )
    _check_writable(out)
    return out


def holds_run(path: Path) -> bool:
    return any((path / name).exists() for name in RUN_FILES + RUN_DIRS)


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TetherError(f"cannot write the run directory {out}: {reason}") from None


def remove_run_files(out: Path) -> None:
    """What --overwrite removes: Tether's outputs of an earlier run (a comparison's per-method
    directories included); any other file stays."""
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)
    for child in out.iterdir():
        if child.is_dir() and holds_run(child):
            remove_run_files(child)


def remove_stale_temporaries(out: Path) -> None:
    """Remove what interrupted atomic writes left (``.NAME.XXXX.tmp``, see observe/files)."""
    for stale in out.glob(".*.tmp"):
        stale.unlink(missing_ok=True)


def _check_same_batch(path: Path, state: dict[str, Any], config: TrainConfig) -> None:
    grid = int(state.get("model_parallel", 1))
    if grid != config.model_parallel or (grid > 1 and state.get("workers") != config.workers):
        raise TetherError(
            f"cannot resume: {path} is a run of {state.get('workers')} workers in model groups "
            f"of {grid}; each rank resumes from its own slices, so resume with "
            f"{both_ways(workers=state.get('workers'), model_parallel=grid)}"
        )
    workers, batch = state.get("workers"), state.get("batch_size")
    if workers is None or batch is None:
        return
    if config.method not in SAME_GLOBAL_BATCH:
        if workers * batch != config.workers * config.batch_size:
            warnings.warn(
                f"resuming {path.parent} at another global batch ({workers} x {batch} -> "
                f"{config.workers} x {config.batch_size}): it goes on from step "
                f"{state['step']} in steps of the new batch, which its epochs, data order and "
                "schedule also take the steps before it to be",
                stacklevel=3,
            )
        return
    if (workers, batch) != (config.workers, config.batch_size):
        raise TetherError(
            f"cannot resume: {path} is a {config.method} run of {workers} workers x batch "
            f"{batch}; {config.workers} x {config.batch_size} would change its global batch "
            f"({workers * batch} -> {config.workers * config.batch_size}) and data order: "
            f"resume with {both_ways(workers=workers, batch_size=batch)}"
        )


def check_model_state(path: Path, saved: dict[str, torch.Tensor], model: nn.Module) -> None:
    """The checkpoint's weights fit ``model``: the same names, the same shapes (one line naming
    the first difference otherwise: a checkpoint of another model or data set)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    found = {name: tuple(t.shape) for name, t in saved.items()}
    missing = [name for name in expected if name not in found]
    extra = [name for name in found if name not in expected]
    wrong = [name for name in expected if name in found and found[name] != expected[name]]
    if not (missing or extra or wrong):
        return
    if wrong:
        name = wrong[0]
        what = f"{name} is {found[name]} there and {expected[name]} in this run's model"
    elif missing:
        what = f"it lacks {missing[0]}"
    else:
        what = f"it holds {extra[0]}, which this run's model does not have"
    more = len(missing) + len(extra) + len(wrong) - 1
    raise TetherError(
        f"cannot resume: {path} holds another model's weights ({what}"
        + (f"; {more} more difference{'s' if more > 1 else ''}" if more else "")
        + "); resume with the model and data set that wrote it"
    )


def validate_checkpoint(path: Path, config: TrainConfig) -> dict[str, Any]:
    """Load ``path`` safely (``weights_only=True``: no code runs) and check it can resume this
    run: its structure, the method and model it was written by, a plausible step, finite
    weights. Raises TetherError in one line otherwise."""
    try:
        with warnings.catch_warnings():  # torch's remarks on a foreign file's pickle protocol
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        # torch's own message may advise weights_only=False, which would run the file's code:
        # never pass that on.
        raise TetherError(
            f"cannot resume: {path} is not a readable Tether checkpoint ({type(exc).__name__}; "
            "truncated, from another program, or not safe to load); nothing was changed"
        ) from None
    if not isinstance(state, dict):
        raise TetherError(f"cannot resume: {path} holds a {type(state).__name__}, not a checkpoint")
    missing = [key for key in CHECKPOINT_KEYS if key not in state]
    if missing:
        raise TetherError(f"cannot resume: {path} lacks {', '.join(missing)} (not a checkpoint)")
    for key, expected in (("method_name", config.method), ("model_name", config.model)):
        recorded = state.get(key)
        if recorded is not None and recorded != expected:
            what = key.removesuffix("_name")
            raise TetherError(
                f"cannot resume: {path} was written by {what} {recorded!r}, this run uses "
                f"{expected!r}; resume with the run's own --{what}"
            )
    _check_same_batch(path, state, config)
    step = state["step"]
    budget = config.steps if config.steps is not None else MAX_STEP
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= budget:
        raise TetherError(f"cannot resume: {path} records step {step!r}, outside 0..{budget}")
    if not isinstance(state["model"], dict) or not all(
        isinstance(v, torch.Tensor) for v in state["model"].values()
    ):
        raise TetherError(f"cannot resume: {path}'s model is not a state dict of tensors")
    for name, tensor in state["model"].items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise TetherError(f"cannot resume: {path} holds non-finite values in {name}")
    for key in ("elapsed_s",):
        if not isinstance(state[key], int | float) or not math.isfinite(state[key]):
            raise TetherError(f"cannot resume: {path} records {key}={state[key]!r}")
    return state
