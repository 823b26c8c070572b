"""Run configuration: one frozen dataclass and its validation (where its values come from: TOML
files, ``--set key=value``, a method's defaults: :mod:`tether.config_sources`).

A config is data only: process groups, modules and optimizers are runtime arguments, never
fields. Variants are made with :func:`dataclasses.replace`. Every mistake a user can make here
is a :class:`~tether.errors.TetherError` with a one-line message.

This module is a leaf: it checks ranges and formats, not names. Which names exist (methods, models,
data sets, optimizers, ...) is :mod:`tether.catalog`'s business, which also applies a method's
tuned defaults.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

import tomli_w

from tether.errors import SettingError, TetherError, one_of
from tether.targets import Target, parse_target

MAX_COUNT = 2**40  # steps, epochs, batch sizes...: more than any run does (message headers' bound)
MAX_WORKERS = 4096
MIN_TIMEOUT_S = 1.0  # below a second, a busy but healthy peer is declared failed

BACKENDS = ("auto", "gloo", "nccl")
PRECISIONS = ("fp32", "bf16", "fp16")
COMPRESSIONS = ("none", "fp16", "bf16")
FAULT_KINDS = ("raise", "kill", "hang", "stop", "hang-after-send")
# lr_scaling: the factor on the rate at r = update batch / lr_base_batch, given r and the cap
# lr_scale_max (TrainConfig.scaled_lr).
LR_SCALINGS: dict[str, Callable[[float, float], float]] = {
    "linear": lambda r, cap: r,
    "sqrt": lambda r, cap: math.sqrt(r),
    "linear-capped": lambda r, cap: min(r, cap),
    "sqrt-capped": lambda r, cap: min(math.sqrt(r), cap),
}
LR_BATCHES = ("global", "node", "worker")  # lr_batch: which batch counts (update_batch)
TRUST_EXCLUDES = ("bias-norm", "none")  # trust_exclude: see TrainConfig


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run. Field names are the TOML keys and ``--set`` keys."""

    method: str = "sync-easgd"
    workers: int = 2
    # A registered name (`tether list`) or an import path ``module:attr``: for the model a
    # zero-argument callable returning an nn.Module (or an nn.Module class); for the data set a
    # callable returning ``(train, eval)`` map-style datasets (eval may be None).
    model: str = "lenet5"
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    epochs: int = 1
    # When set, the run length in optimizer steps; it takes precedence over epochs.
    steps: int | None = None
    batch_size: int = 64  # per worker; the global batch is batch_size * workers
    # When set and neither batch_size nor lr is given, the per-worker batch shrinks as workers
    # are added: global_batch_max // P, not below global_batch_max // 8 (config_sources.
    # held_batch_size). 0: off. Set by the methods whose workers step on their own batch.
    global_batch_max: int = 0
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    lars_eta: float = 0.001  # LARS's trust coefficient (--optimizer lars)
    # LARS's and LAMB's exclusion rule: "bias-norm" (tensors of at most one dimension take
    # neither the trust ratio nor weight decay, Jia et al. 2018) or "none" (every tensor takes both).
    trust_exclude: str = "bias-norm"
    # The local update: "auto" (the method's own: momentum SGD for sync-sgd and local-sgd, plain
    # SGD for the EASGD workers, EAMSGD's Nesterov step for async-measgd, ...), a name (sgd, adam,
    # adamw) or an import path to a factory ``params -> torch.optim.Optimizer``.
    optimizer: str = "auto"
    # Learning-rate schedule, stepped per optimizer step: constant, step, cosine, or an import
    # path to a factory ``optimizer -> LRScheduler``; a linear warm-up over warmup_steps first.
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    warmup_epochs: float = 0.0  # the warm-up in epochs (adds to warmup_steps)
    lr_decay_every: int = 0  # the step schedule's period (0: a third of the post-warm-up run)
    lr_decay: float = 0.1  # the step schedule's factor
    lr_decay_power: float = 2.0  # the poly schedule's power
    # Scaling the rate with the batch: when lr_base_batch is set, lr is the rate at a batch of
    # that many samples, and at a batch of B samples (the batch one update averages over:
    # lr_batch, see update_batch) the optimizer takes lr * r, r = B / lr_base_batch
    # (lr_scaling "linear"), lr * sqrt(r) ("sqrt"), lr * min(r, lr_scale_max)
    # ("linear-capped": linear up to lr_scale_max times the base batch, constant beyond), or
    # lr * min(sqrt(r), lr_scale_max) ("sqrt-capped"). The methods' defaults set them; an lr
    # given without lr_base_batch is taken as it is.
    lr_base_batch: int = 0
    lr_scaling: str = "linear"
    lr_scale_max: float = 1.0  # the cap of "linear-capped" and "sqrt-capped"
    lr_batch: str = "global"  # "global", "node" or "worker": see update_batch
    # Damping an asynchronous parameter-server method's step as workers are added: when set, its
    # defaults were tuned at this many workers, and with P more each push is about P updates
    # stale, which acts as extra momentum; the step is damped by min(1, base / P)
    # (async_damping; how a method applies it: tether.methods.default_rates.damped_step).
    async_base_workers: int = 0
    # Clip the gradient's global norm to this before each update (after the all-reduce in the
    # synchronous methods, so every rank clips alike; per worker elsewhere).
    clip_grad_norm: float | None = None
    # The loss: cross-entropy, mse, l1, or an import path to ``loss(outputs, targets)`` or
    # ``loss(model, batch)`` (named so) returning a scalar tensor.
    loss: str = "cross-entropy"
    label_smoothing: float = 0.0  # cross-entropy only
    # Evaluation metrics: names (accuracy) or import paths to ``metric(outputs, targets) ->
    # float``, averaged over the evaluation set; empty: the loss, plus accuracy for classifiers.
    metrics: tuple[str, ...] = ()
    # Forward and backward in fp32, bf16 or fp16 (torch.autocast; fp32 weights and update;
    # fp16 with dynamic loss scaling: initial loss_scale, x loss_scale_backoff and the step
    # skipped on inf/NaN, x loss_scale_growth after loss_scale_growth_interval clean steps).
    precision: str = "fp32"
    loss_scale: float = 65536.0
    loss_scale_growth_interval: int = 2000
    loss_scale_growth: float = 2.0
    loss_scale_backoff: float = 0.5
    # Backward passes per optimizer step (gradient accumulation): the batch of one update is
    # batch_size * workers * accumulate, and communication happens once per update.
    accumulate: int = 1
    seed: int = 0
    # A test-metric threshold to time (and, with stop_at_target, stop at): "accuracy>=0.88",
    # "loss<=0.3". target_accuracy=0.88 is the same as target="accuracy>=0.88".
    target: str | None = None
    target_accuracy: float | None = None
    stop_at_target: bool = False
    # Evaluate every this many steps; 0 picks about four evaluations per epoch. Without
    # evaluation data only the last step is evaluated (training.evaluation.eval_interval).
    eval_every: int = 0
    out: str | None = None
    backend: str = "auto"
    # Gradient fusion bucket size in MiB; 0 sends one message per parameter (no fusion).
    bucket_mb: float = 1.0
    # Collective algorithm for the gradient / parameter all-reduce of sync-sgd, sync-easgd and
    # local-sgd: a name from `tether list` (collectives), or "auto" (per message size, the fastest
    # as timed by a calibration of the running group), or "native" (the backend's own).
    allreduce: str = "native"
    # Wire format of those all-reduces: "none" (the parameters' dtype), "fp16" or "bf16"
    # (pre-divided by the number of workers so that fp16 sums cannot overflow).
    compress: str = "none"
    # Ranks per node for the hierarchical collective; 0 takes the launcher's local world size.
    ranks_per_node: int = 0
    # Model parallelism (tether.parallel): model groups of this many ranks split the layers that
    # parallel_plan names ("layer=kind": column, row, channel, input-channel); the workers // K
    # data-parallel workers each see their own share of the global batch.
    model_parallel: int = 1
    parallel_plan: tuple[str, ...] = ()
    # Write DIR/timeline.json, a Chrome trace of compute and communication per rank.
    timeline: bool = False
    # Also write TensorBoard event files to DIR/tensorboard (needs the tensorboard package).
    tensorboard: bool = False
    eval_batch_size: int = 1000
    # DataLoader worker processes per training worker for datasets that are not in-memory
    # tensors (0: load in the training process).
    loader_workers: int = 0
    # Intra-op threads of each worker process (0: the node's usable cores divided by its
    # processes, at least 1), and whether each process is pinned to its own group of that many
    # cores when they fit (SC17's chip partitioning: tether.launch.partition).
    threads_per_worker: int = 0
    pin_workers: bool = True
    checkpoint_every: int = 0
    # EASGD's elastic rate: alpha, or rho with alpha = lr * rho (the scaled lr); neither: 0.9 / P.
    alpha: float | None = None
    rho: float | None = None
    # Communication period in local steps (EASGD exchanges, local-sgd averaging, async pushes).
    tau: int = 1
    # async-sgd/msgd: drop gradients computed on weights more than this many updates old.
    staleness_bound: int | None = None
    # Co-design switches (SC17 section 5): overlap communication with computation (sync-easgd:
    # the round's all-reduce with the next local steps; sync-sgd: each bucket's all-reduce with
    # the rest of backward); sync-easgd sends all layers as one flat message (False: per layer).
    overlap: bool = True
    single_message: bool = True
    # Set by `--resume DIR`: continue the run whose checkpoint is in DIR (and write there).
    resume: bool = False
    # Collective / point-to-point timeout: a hung peer turns into an error after this long.
    timeout_s: float = 60.0
    progress: bool = True
    # Fault injection for reliability tests: rank `fault_rank` fails at step `fault_step` (-1:
    # none): raise, kill -9 itself, hang, SIGSTOP itself, or hang between a send and its reply.
    fault_rank: int = -1
    fault_step: int = 0
    fault_kind: str = "raise"

    @property
    def data_workers(self) -> int:
        """The data-parallel workers: every model group of ``model_parallel`` ranks is one."""
        return self.workers // self.model_parallel

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.data_workers

    def on_nodes_of(self, local_world_size: int) -> TrainConfig:
        """This config with an unset ``ranks_per_node`` ("the launcher's") taken from the
        launcher's node size where it sets the rate (``lr_batch`` "node"): across nodes under
        torchrun the node's batch is its ranks', not every worker's."""
        if self.lr_batch != "node" or self.ranks_per_node or local_world_size <= 0:
            return self
        return dataclasses.replace(self, ranks_per_node=local_world_size)

    @property
    def update_batch(self) -> int:
        """The samples one optimizer update averages over, as ``lr_batch`` counts them:
        ``global``, every data worker's batch (sync-sgd's all-reduced gradient, local-sgd's
        averaged replicas); ``node``, the batches of one node's ranks (two-level-easgd's in-node
        step; ``ranks_per_node``, or every worker when it is unset); ``worker``, the worker's
        own batch (each EASGD or parameter-server worker steps on its own). Times
        ``accumulate``."""
        ranks = {"global": self.data_workers, "node": self.ranks_per_node or self.data_workers}
        return self.batch_size * self.accumulate * ranks.get(self.lr_batch, 1)

    @property
    def scaled_lr(self) -> float:
        """The learning rate the optimizer takes: ``lr``, or with ``lr_base_batch`` set ``lr``
        times ``r = update_batch / lr_base_batch`` (linear: Goyal et al. 2017), its square root
        (Krizhevsky 2014, Hoffer et al. 2017), ``min(r, lr_scale_max)`` (the linear rule holds up
        to a critical batch: McCandlish et al. 2018) or ``min(sqrt(r), lr_scale_max)``."""
        if not self.lr_base_batch:
            return self.lr
        r = self.update_batch / self.lr_base_batch
        return self.lr * LR_SCALINGS[self.lr_scaling](r, self.lr_scale_max)

    @property
    def async_damping(self) -> float:
        """``min(1, async_base_workers / P)`` for P data workers; 1 when unset. Staleness grows
        with the workers, and an asynchronous update with P workers behaves like SGD with an
        extra momentum of about ``1 - 1/P`` (Mitliagkas et al. 2016, "Asynchrony begets
        momentum"): the factor keeps the effective step where the defaults were tuned."""
        if not self.async_base_workers:
            return 1.0
        return min(1.0, self.async_base_workers / self.data_workers)

    @property
    def target_spec(self) -> Target | None:
        """The target as a metric, a direction and a threshold (None: no target)."""
        if self.target is not None:
            return parse_target(self.target)
        if self.target_accuracy is not None:
            return Target("accuracy", True, self.target_accuracy)
        return None

    def validate(self) -> TrainConfig:
        """Check ranges and names; returns self so calls chain. Raises TetherError on bad input
        (a SettingError, naming the setting and the value refused, where it is one's)."""
        try:
            _validate(self)
        except SettingError as refused:
            raise refused.with_value(getattr(self, refused.key)) from None
        return self

    def to_toml(self) -> str:
        # TOML has no null: unset optional fields are simply absent and read back as None.
        data = {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(self).items()
            if v is not None
        }
        return tomli_w.dumps(data)


def _validate(config: TrainConfig) -> None:
    """Every range and format (see TrainConfig.validate); a refusal's value is added there."""
    _check_magnitudes(config)
    _require(config.workers >= 1, f"workers must be >= 1, got {config.workers}")
    _require(config.workers <= MAX_WORKERS, f"workers must be <= {MAX_WORKERS}")
    _require(config.batch_size >= 1, f"batch_size must be >= 1, got {config.batch_size}")
    _require(config.global_batch_max >= 0, "global_batch_max must be >= 0 (0: off)")
    _require(config.lr > 0, f"lr must be > 0, got {config.lr}")
    _require(0 <= config.momentum < 1, f"momentum must be in [0, 1), got {config.momentum}")
    _require(config.weight_decay >= 0, f"weight_decay must be >= 0, got {config.weight_decay}")
    _require(config.epochs >= 1, f"epochs must be >= 1, got {config.epochs}")
    _require(config.steps is None or config.steps >= 1, f"steps must be >= 1, got {config.steps}")
    _require(config.eval_every >= 0, f"eval_every must be >= 0, got {config.eval_every}")
    _require(
        config.threads_per_worker >= 0, "threads_per_worker must be >= 0 (0: divide the cores)"
    )
    _require(config.bucket_mb >= 0, f"bucket_mb must be >= 0, got {config.bucket_mb}")
    _require(config.checkpoint_every >= 0, "checkpoint_every must be >= 0")
    _require(config.tau >= 1, f"tau must be >= 1, got {config.tau}")
    if config.alpha is not None:
        _require(0 < config.alpha < 1, f"alpha must be in (0, 1), got {config.alpha}")
    _require(config.rho is None or config.rho > 0, f"rho must be > 0, got {config.rho}")
    _require(
        config.rho is None or config.alpha is None,
        f"rho ({config.rho}) and alpha ({config.alpha}) set one rate twice (alpha = lr x rho): "
        "give one of them",
    )
    if config.staleness_bound is not None:
        _require(config.staleness_bound >= 0, "staleness_bound must be >= 0")
    _require(
        config.timeout_s >= MIN_TIMEOUT_S,
        f"timeout_s must be >= {MIN_TIMEOUT_S:g} s (peers need time to answer), "
        f"got {config.timeout_s}",
    )
    _require(
        config.fault_rank >= -1,
        f"fault_rank must be -1 (no fault) or a rank, got {config.fault_rank}",
    )
    _require(
        config.ranks_per_node >= 0, f"ranks_per_node must be >= 0, got {config.ranks_per_node}"
    )
    if config.ranks_per_node:
        _require(
            config.workers % config.ranks_per_node == 0,
            f"workers ({config.workers}) must be a multiple of ranks_per_node "
            f"({config.ranks_per_node})",
        )
    _require(
        config.model_parallel >= 1, f"model_parallel must be >= 1, got {config.model_parallel}"
    )
    _require(
        config.workers % config.model_parallel == 0,
        f"model_parallel ({config.model_parallel}) must divide the {config.workers} workers "
        "(each model group takes that many ranks); choose workers as a multiple of it",
    )
    if config.target_accuracy is not None:
        _require(
            0 < config.target_accuracy <= 1,
            f"target_accuracy is a fraction in (0, 1], got {config.target_accuracy}"
            " (write 0.88 for 88%)",
        )
        _require(
            config.target is None,
            "give target_accuracy or target, not both (target_accuracy=0.88 is "
            'target="accuracy>=0.88")',
        )
    if config.target is not None:
        parse_target(config.target)
    _require(config.warmup_steps >= 0, f"warmup_steps must be >= 0, got {config.warmup_steps}")
    _require(config.warmup_epochs >= 0, f"warmup_epochs must be >= 0, got {config.warmup_epochs}")
    _require(config.lr_decay_power > 0, "lr_decay_power must be > 0")
    _require(config.lr_base_batch >= 0, "lr_base_batch must be >= 0 (0: no scaling)")
    _require(config.lr_scale_max > 0, f"lr_scale_max must be > 0, got {config.lr_scale_max}")
    _require(config.async_base_workers >= 0, "async_base_workers must be >= 0 (0: no damping)")
    if config.clip_grad_norm is not None:
        _require(config.clip_grad_norm > 0, "clip_grad_norm must be > 0")
    _require(config.lars_eta > 0, f"lars_eta must be > 0, got {config.lars_eta}")
    for name, choices in _CHOICES.items():
        value = getattr(config, name)
        _require(value in choices, f"{name} must be {one_of(choices)}, got {value!r}")
    _require(config.lr_decay_every >= 0, "lr_decay_every must be >= 0")
    _require(0 < config.lr_decay <= 1, f"lr_decay must be in (0, 1], got {config.lr_decay}")
    _require(
        0 <= config.label_smoothing < 1,
        f"label_smoothing must be in [0, 1), got {config.label_smoothing}",
    )
    _require(config.accumulate >= 1, f"accumulate must be >= 1, got {config.accumulate}")
    _require(config.loss_scale > 0, "loss_scale must be > 0")
    _require(config.loss_scale_growth_interval >= 1, "loss_scale_growth_interval must be >= 1")
    _require(config.loss_scale_growth >= 1, "loss_scale_growth must be >= 1")
    _require(0 < config.loss_scale_backoff < 1, "loss_scale_backoff must be in (0, 1)")
    _require(config.eval_batch_size >= 1, "eval_batch_size must be >= 1")
    _require(config.loader_workers >= 0, "loader_workers must be >= 0")


def _check_magnitudes(config: TrainConfig) -> None:
    """Every number of a config is finite and of a size a run can use: counts below 2**40,
    seeds in [0, 2**63) (what torch and numpy accept)."""
    for field in fields(config):
        value = getattr(config, field.name)
        if isinstance(value, bool):
            continue
        if isinstance(value, float):
            _require(math.isfinite(value), f"{field.name} must be a finite number, got {value}")
        elif isinstance(value, int):
            if field.name == "seed":
                _require(0 <= value < 2**63, f"seed must be in [0, 2**63), got {value}")
            else:
                _require(abs(value) <= MAX_COUNT, f"{field.name} must be below 2**40, got {value}")


# The settings that take one of a few names.
_CHOICES: dict[str, Iterable[str]] = {
    "backend": BACKENDS,
    "precision": PRECISIONS,
    "compress": COMPRESSIONS,
    "fault_kind": FAULT_KINDS,
    "lr_scaling": LR_SCALINGS,
    "lr_batch": LR_BATCHES,
    "trust_exclude": TRUST_EXCLUDES,
}


def _require(ok: bool, message: str) -> None:
    """Refuse a value: a message that begins with a setting's key names it (SettingError), so
    that the command line can say it as its option."""
    if not ok:
        key = message.split(" ", 1)[0]
        named = key in {field.name for field in fields(TrainConfig)}
        raise SettingError(key, message) if named else TetherError(message)
