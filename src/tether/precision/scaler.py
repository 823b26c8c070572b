"""Dynamic loss scaling for fp16, with torch's ``GradScaler`` semantics, inside a method's step.

The loss is multiplied by a scale ``S`` before backward, so that small gradients survive fp16;
before the update the gradients are divided by ``S``. If any of them is inf or NaN the step is
skipped and ``S`` halves; after ``growth_interval`` clean steps in a row ``S`` doubles (initial
``2**16``, factors 2 and 0.5, interval 2000: ``torch.amp.GradScaler``'s defaults).

Why not ``GradScaler`` itself: the decision must be taken at the right point of a distributed
step. In sync-sgd the gradients are unscaled after their all-reduce (unscaling during it would
touch buffers still in flight), and an inf on one rank reaches every rank through the sum; in
sync-easgd, whose workers reduce no gradients, the overflow flags are all-reduced with MAX so that
every rank skips the same step (as FSDP's sharded scaler and Megatron do); the other methods'
workers decide alone, and a parameter-server worker never pushes a gradient that overflowed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from tether.config import TrainConfig
from tether.spelling import both_ways

# Overflows in a row, the last with the loss scale below 1 (it no longer magnifies the loss),
# that say the values themselves do not fit fp16: warned once (from the default 2**16, the 17th
# overflow in a row; from a scale already below 1, the 8th).
UNTRAINABLE_STREAK = 8


@dataclass(frozen=True)
class ScalerSettings:
    """``loss_scale`` (initial), ``loss_scale_growth_interval``, ``loss_scale_growth``,
    ``loss_scale_backoff`` (config keys of the same names)."""

    init_scale: float = 2.0**16
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5

    @staticmethod
    def of(config: TrainConfig) -> ScalerSettings:
        return ScalerSettings(
            config.loss_scale,
            config.loss_scale_growth_interval,
            config.loss_scale_growth,
            config.loss_scale_backoff,
        )


class LossScaler:
    """The scale and its bookkeeping; ``share`` (a MAX all-reduce of the overflow flag, or None)
    makes every rank of a group take the same decision."""

    def __init__(
        self,
        settings: ScalerSettings = ScalerSettings(),
        share: Callable[[torch.Tensor], None] | None = None,
        rank: int | None = None,
    ) -> None:
        self.settings = settings
        self.rank = rank  # whose warning it is (None: no rank to name)
        self.scale = float(settings.init_scale)
        self.clean_steps = 0  # steps since the last overflow
        self.skipped = 0  # steps skipped for an overflow, in this run
        self.in_a_row = 0  # overflows since the last clean step
        self.said = False  # whether the warning of a run that cannot train was given
        self.share = share
        self.scaled = False  # whether the last backward pass was of a scaled loss

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        self.scaled = True
        return loss * self.scale

    def unscale(self, grads: Iterable[torch.Tensor]) -> bool:
        """Divide the gradients by the scale in place; True when any is inf or NaN (on any rank
        of the sharing group)."""
        grads = [g for g in grads if g is not None]
        found = torch.zeros(1, dtype=torch.float32)
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)
            norms = torch.stack([g.detach().float().abs().amax() for g in grads])
            found = (~torch.isfinite(norms)).any().float().reshape(1).cpu()
        if self.share is not None:
            self.share(found)
        self.scaled = False
        return bool(found.item())

    def update(self, overflow: bool) -> None:
        """After a step: back off on an overflow, grow after enough clean steps."""
        if overflow:
            self.scale *= self.settings.backoff_factor
            self.clean_steps = 0
            self.skipped += 1
            self.in_a_row += 1
            if self.scale < 1.0 and self.in_a_row >= UNTRAINABLE_STREAK and not self.said:
                self._say_nothing_trains()
            return
        self.clean_steps += 1
        self.in_a_row = 0
        if self.clean_steps >= self.settings.growth_interval:
            self.scale *= self.settings.growth_factor
            self.clean_steps = 0

    def _say_nothing_trains(self) -> None:
        """The scale no longer magnifies the loss and the steps still overflow: the values
        themselves do not fit fp16, every step is skipped and the run would end "trained" with
        its first weights (found by a user: 30 of 30 steps skipped, exit status 0, no word)."""
        self.said = True
        who = f"rank {self.rank}: " if self.rank is not None else ""
        print(
            f"tether: warning: {who}fp16: the last {self.in_a_row} steps overflowed (inf or NaN "
            f"gradients) and were skipped, the loss scale down to {self.scale:g} from "
            f"{self.settings.init_scale:g}: the forward or backward pass makes values fp16 cannot "
            f"hold and the model is not training; switch to bf16 with "
            f"{both_ways(precision='bf16')}, or lower the learning rate if the weights diverged",
            file=sys.stderr,
            flush=True,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "clean_steps": self.clean_steps,
            "skipped": self.skipped,
            "in_a_row": self.in_a_row,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.skipped = int(state.get("skipped", 0))
        self.in_a_row = int(state.get("in_a_row", 0))
