"""The options of ``tether train`` (and ``tether compare``, ``python -m tether.run``): each a
config key, set only when given, so that a config file, ``--set`` and a resumed run's config
keep what the command line leaves alone (:func:`config_from_args`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether.config import TrainConfig
from tether.config_sources import apply_overrides, load_toml, parse_set_options
from tether.errors import SettingError, TetherError
from tether.resume_settings import check_kept, saved_config

# (flag, config key, type, help). Every option defaults to "not given" so that only explicit
# options override the config file (and, with --resume, the resumed run's config).
TRAIN_OPTIONS: list[tuple[str, str, Any, str]] = [
    ("--method", "method", str, "training method (see `tether list`)"),
    ("--workers", "workers", int, "number of computing worker processes"),
    ("--model", "model", str, "model name (see `tether list`)"),
    ("--dataset", "dataset", str, "data set name (see `tether list`)"),
    ("--data-dir", "data_dir", str, "directory holding the data set's files"),
    ("--epochs", "epochs", int, "epochs to train (ignored when --steps is given)"),
    ("--steps", "steps", int, "optimizer steps to train (overrides --epochs)"),
    ("--batch-size", "batch_size", int, "per-worker batch size"),
    ("--lr", "lr", float, "learning rate"),
    ("--momentum", "momentum", float, "momentum"),
    ("--weight-decay", "weight_decay", float, "L2 weight decay"),
    ("--seed", "seed", int, "random seed (data order, initial weights, torch, random, numpy)"),
    ("--target-accuracy", "target_accuracy", float, "test accuracy to time (fraction, e.g. 0.88)"),
    (
        "--eval-every",
        "eval_every",
        int,
        "evaluate every N steps (0: 4 times an epoch, at least 8 times a run)",
    ),
    ("--out", "out", str, "run directory (default: runs/METHOD-TIMESTAMP)"),
    (
        "--backend",
        "backend",
        str,
        "gloo | nccl | auto (nccl where this node has a GPU for each rank that needs one, "
        "else gloo)",
    ),
    (
        "--bucket-mb",
        "bucket_mb",
        float,
        "gradient fusion bucket size in MiB (0: one message per parameter)",
    ),
    (
        "--allreduce",
        "allreduce",
        str,
        "all-reduce algorithm for sync-sgd/sync-easgd/local-sgd: auto, native, ring, ...",
    ),
    ("--compress", "compress", str, "all-reduce wire format: none | fp16 | bf16"),
    (
        "--ranks-per-node",
        "ranks_per_node",
        int,
        "ranks per node (0: the launcher's): the nodes of --allreduce hierarchical and of "
        "auto's choice, of two-level-easgd, of lr_batch node's batch, and the node a model "
        "group stays on (a multiple of --model-parallel); fewer than the workers emulates "
        "nodes on one machine",
    ),
    (
        "--threads-per-worker",
        "threads_per_worker",
        int,
        "intra-op threads per worker process (0: the node's cores divided among its workers)",
    ),
    (
        "--checkpoint-every",
        "checkpoint_every",
        int,
        "write a checkpoint every N steps and at the last",
    ),
    ("--timeout", "timeout_s", float, "seconds before a silent peer is declared failed"),
    (
        "--optimizer",
        "optimizer",
        str,
        "auto (the method's own) | sgd | adam | adamw | lars | lamb | module:factory (params -> Optimizer)",
    ),
    (
        "--lr-schedule",
        "lr_schedule",
        str,
        "constant | step | cosine | poly | module:factory (optimizer -> LRScheduler)",
    ),
    ("--warmup-steps", "warmup_steps", int, "linear learning-rate warm-up over N steps"),
    ("--loss", "loss", str, "cross-entropy | mse | l1 | module:function"),
    (
        "--accumulate",
        "accumulate",
        int,
        "backward passes per optimizer step (gradient accumulation)",
    ),
    ("--target", "target", str, "a test metric to time, e.g. 'accuracy>=0.9' or 'loss<=0.3'"),
    ("--precision", "precision", str, "fp32 | bf16 | fp16 (autocast; fp16 scales the loss)"),
    ("--clip-grad-norm", "clip_grad_norm", float, "clip the gradient's global norm to this"),
    ("--warmup-epochs", "warmup_epochs", float, "linear learning-rate warm-up over N epochs"),
    ("--alpha", "alpha", float, "EASGD elastic rate (default: 0.9 / workers)"),
    ("--rho", "rho", float, "EASGD elastic coefficient: alpha = lr * rho"),
    ("--tau", "tau", int, "communication period in local steps (EASGD, local-sgd, async)"),
    ("--staleness-bound", "staleness_bound", int, "async-sgd/msgd: drop staler gradients"),
    (
        "--model-parallel",
        "model_parallel",
        int,
        "ranks per model group, which split the layers --parallel-plan names (default 1)",
    ),
]


# Options that take no value (and --metric, repeatable): (flag, config key, argparse action,
# help). Like TRAIN_OPTIONS, what is set here reaches the config (config_from_args).
FLAG_OPTIONS: list[tuple[str, str, str, str]] = [
    (
        "--stop-at-target",
        "stop_at_target",
        "store_true",
        "stop as soon as the run's target is reached (--target-accuracy; tether train: or "
        "--target)",
    ),
    (
        "--no-pin-workers",
        "pin_workers",
        "store_false",
        "do not give each worker process its own group of cores",
    ),
    (
        "--timeline",
        "timeline",
        "store_true",
        "write DIR/timeline.json, a Chrome trace of compute and communication per rank",
    ),
    (
        "--metric",
        "metrics",
        "append",
        "evaluation metric (accuracy, mae, mse, or module:function), repeatable",
    ),
    (
        "--tensorboard",
        "tensorboard",
        "store_true",
        "also write TensorBoard event files to DIR/tensorboard",
    ),
    ("--no-progress", "progress", "store_false", "no progress bar"),
    (
        "--parallel-plan",
        "parallel_plan",
        "append",
        "layers to split: name=kind,... with kinds column, row, channel, input-channel; "
        "repeatable (the entries add up)",
    ),
]
FLAG_KEYS = tuple(key for _, key, _, _ in FLAG_OPTIONS)
_FLAG_OF = {key: flag for flag, key, *_ in (*TRAIN_OPTIONS, *FLAG_OPTIONS)}


def as_flag(key: str, value: object = None) -> str:
    """The command line's spelling of a setting (:class:`tether.spelling.Spell`):
    ``--lr-schedule step``, or ``--set lars_eta=0.002`` for a key with no flag of its own."""
    flag = _FLAG_OF.get(key)  # not always the key dashed: --timeout, --metric, --no-progress
    if flag is None:
        return f"--set {key}" if value is None else f"--set {key}={value}"
    return flag if value is None else f"{flag} {value}"


def said_as_typed(refused: SettingError, args: argparse.Namespace) -> TetherError:
    """``refused`` with each setting it names said as the option the user typed (``args``
    holds those; one from ``--set`` or ``--config`` stays a key), and the settings its advice
    names as flags (every command that can meet such a refusal has those flags)."""
    typed = {key: flag for key, flag in _FLAG_OF.items() if hasattr(args, key)}
    return refused.respelled(typed, _FLAG_OF)


def add_train_options(
    parser: argparse.ArgumentParser,
    out_default: str = "runs/METHOD-TIMESTAMP",
    resumable: bool = True,
    target_help: str | None = None,
    unlisted: tuple[str, ...] = (),
) -> None:
    """The training options of ``tether train`` (``tether compare``: its own --out default, no
    --resume: a comparison is not resumed, its own word on --target, and ``unlisted`` keys
    left out of its help: --method, which it takes only to refuse in favour of --methods)."""
    for flag, key, typ, help_text in TRAIN_OPTIONS:
        if key == "out":
            help_text = f"run directory (default: {out_default})"
        if key == "target" and target_help is not None:
            help_text = target_help
        if key in unlisted:
            help_text = argparse.SUPPRESS
        parser.add_argument(flag, dest=key, type=typ, default=argparse.SUPPRESS, help=help_text)
    for flag, key, action, help_text in FLAG_OPTIONS:
        metavar = "LAYER=KIND,..." if key == "parallel_plan" else "NAME"
        named: dict[str, Any] = {"metavar": metavar} if action == "append" else {}
        parser.add_argument(
            flag, dest=key, action=action, default=argparse.SUPPRESS, help=help_text, **named
        )
    parser.add_argument("--config", type=Path, help="TOML file with config keys")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key (TOML value syntax), repeatable",
    )
    if resumable:
        parser.add_argument(
            "--resume",
            type=Path,
            metavar="DIR",
            help="continue the run in DIR from its last checkpoint",
        )
    else:
        parser.set_defaults(resume=None)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in --out (its Tether files only); without it a non-empty --out "
        "is refused",
    )


def given_values(args: argparse.Namespace) -> dict[str, Any]:
    """What the user set for this run, each config key once: the --config file <- --set <-
    explicit options (the file read here, once). Its keys are also what the warnings about
    settings the method ignores look at, and what decides whether a method may hold the batch."""
    explicit = {key: getattr(args, key) for _, key, _, _ in TRAIN_OPTIONS if hasattr(args, key)}
    for key in FLAG_KEYS:
        if hasattr(args, key):
            explicit[key] = getattr(args, key)
    from_file = load_toml(args.config) if args.config is not None else {}
    return {**from_file, **parse_set_options(args.overrides), **explicit}


def config_from_args(
    args: argparse.Namespace,
    default_out: Callable[[TrainConfig], str],
    given: dict[str, Any] | None = None,
    world_size: int | None = None,
) -> TrainConfig:
    """Defaults <- resumed run's config <- --config file <- --set <- explicit options
    (``given``: :func:`given_values`, read here when not passed); a resume that would change a
    setting its checkpoint was made under is refused (:func:`tether.resume_settings.check_kept`,
    as ``tether.fit`` does). ``world_size``: the
    launcher's processes (``python -m tether.run``); the workers are what the method's servers
    leave of them, set before the config is resolved, so that what follows from the count (a
    method's held batch) is the count's."""
    from tether.catalog import resolve_config
    from tether.ignored_settings import own_component_keys
    from tether.methods import METHODS

    overrides = dict(given_values(args) if given is None else given)
    base = None
    if args.resume is not None:
        base = saved_config(args.resume, overrides)
        for key in ("method", "model"):
            asked = getattr(args, key, None)
            if asked is not None and asked != getattr(base, key):
                raise TetherError(
                    f"--resume {args.resume} continues a {key} {getattr(base, key)!r} run; "
                    f"--{key} {asked} would be another run: drop --{key}, or start a new run"
                )
        asked_out = overrides.get("out")
        if asked_out is not None and Path(str(asked_out)).resolve() != args.resume.resolve():
            # a resume writes where its checkpoint is; a copy elsewhere would be a fork, which
            # nothing here makes (it used to extend DIR and ignore --out)
            raise TetherError(
                f"--resume {args.resume} continues the run in {args.resume} and writes there; "
                f"--out {asked_out} would be another directory: drop --out, or start a new run "
                f"in {asked_out} without --resume"
            )
        overrides.update(out=str(args.resume), resume=True)
    if world_size is not None:
        method = overrides.get("method", (base or TrainConfig()).method)
        overrides["workers"] = world_size - METHODS.get(str(method)).server_processes
    try:
        config = resolve_config(None, overrides, base)
    except SettingError as refused:
        raise said_as_typed(refused, args) from None
    if base is not None:
        # e.g. another --lr, which torch would undo; not one an --optimizer import path ignores
        check_kept(base, config, args.resume, own_component_keys(config))
    if config.out is None:
        config = apply_overrides(config, {"out": default_out(config)})
    return config
