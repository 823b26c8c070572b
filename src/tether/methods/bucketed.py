"""The gradient side of the methods whose gradients are averaged during backward by a
:class:`~tether.comm.fusion.GradientBucketer` (sync-sgd over all ranks, two-level-easgd inside a
node): every gradient is a view of the bucketer's one flat buffer, so zeroing, scaling, the fp16
check and clipping each work on that buffer at once, after the all-reduce, alike on every rank
of the group."""

from __future__ import annotations

import torch

from tether.comm.fusion import GradientBucketer
from tether.methods.base import TrainingMethod


class BucketedGradients(TrainingMethod):
    """Mixed in before the method's base; ``bucketer`` None (a group of one) leaves each
    operation to that base."""

    bucketer: GradientBucketer | None = None

    def zero_grad(self) -> None:
        # One memset of the flat gradient buffer, the parameters' .grad staying views into it:
        # cheaper than freeing and reallocating every gradient, and no copy into the buckets.
        if self.bucketer is None:
            super().zero_grad()
        else:
            self.bucketer.zero_grad()

    def set_gradient_sync(self, enabled: bool) -> None:
        if self.bucketer is not None:
            self.bucketer.enabled = enabled

    def wait_for_gradients(self) -> tuple[float, float]:
        """The bucketer's wait for the last buckets (an empty interval without one)."""
        return self.bucketer.finish() if self.bucketer is not None else (0.0, 0.0)

    def scale_gradients(self) -> None:
        if self.bucketer is None:
            super().scale_gradients()
        elif self.grad_scale != 1.0:
            self.bucketer.flat.mul_(self.grad_scale)  # every gradient is a view of it

    def gradients_to_unscale(self) -> list[torch.Tensor]:
        # After the all-reduce every rank of the group holds the same sum, so an inf or NaN on
        # any rank is in every rank's buffer: the overflow decision is the same everywhere.
        return super().gradients_to_unscale() if self.bucketer is None else [self.bucketer.flat]

    def clip_gradients(self) -> None:
        """The global norm over the fused buffer at once (every gradient is a view of it), with
        ``clip_grad_norm_``'s formula; after the all-reduce, so every rank clips alike."""
        max_norm = self.config.clip_grad_norm
        if self.bucketer is None or max_norm is None or self.context.grid is not None:
            super().clip_gradients()  # (under model parallelism: the slices' norm together)
            return
        flat = self.bucketer.flat
        coefficient = max_norm / (torch.linalg.vector_norm(flat) + 1e-6)
        flat.mul_(torch.clamp(coefficient, max=1.0))

    def remove_bucketer(self) -> None:
        # The gradient hooks hold the bucketer, and through it the transport and the group's
        # backend, in a cycle through autograd that the garbage collector cannot break; left in
        # place they keep the backend alive into the interpreter's exit (tether.launch.teardown).
        if self.bucketer is not None:
            self.bucketer.remove()
