"""What LARS and LAMB share: which parameters get a layer-wise trust ratio, and the norms.

Jia et al. (2018, "Highly scalable deep learning training system with mixed-precision") train
ResNet-50 at a 64k batch with LARS and exclude the biases and batch-norm parameters from both the
trust ratio and weight decay; Paddle measured 75.4% -> 76.1% top-1 at a 16k batch from that
alone. The default rule here is theirs by shape: a tensor of at most one dimension (a bias, a
norm's scale or shift) is excluded.

The trust ratio needs the norm of a whole layer's weights and gradient. When a layer is sharded
over several ranks (model parallelism), each rank holds a slice: :meth:`TrustRatio.reduce_norms`
registers, for those parameters, a callable that sums a tensor of squared norms over the shard
group in place, which makes the norms those of the whole tensor.

Callables live on the optimizer object, never in its parameter groups: a checkpoint holds the
groups' hyperparameters and must load with ``weights_only=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

ExcludeRule = Callable[[torch.Tensor], bool]


def is_bias_or_norm(param: torch.Tensor) -> bool:
    """The default exclusion: tensors of at most one dimension (biases, normalisation scales
    and shifts) get neither the trust ratio nor weight decay."""
    return param.ndim <= 1


def _nothing(param: torch.Tensor) -> bool:
    """No exclusion (``exclude=None``): every tensor takes the ratio and weight decay."""
    return False


# The rules by name (the run's ``trust_exclude``, for ``--optimizer lars`` and ``lamb``).
EXCLUSIONS: dict[str, ExcludeRule | None] = {"bias-norm": is_bias_or_norm, "none": None}


class TrustRatio:
    """The exclusion rule and the per-parameter norm reductions of a trust-ratio optimizer."""

    def __init__(self, exclude: ExcludeRule | None) -> None:
        self.exclude: ExcludeRule = exclude if exclude is not None else _nothing
        self._reduce: dict[int, Callable[[torch.Tensor], None]] = {}

    def reduce_norms(
        self, params: Iterable[torch.Tensor], reduce: Callable[[torch.Tensor], None]
    ) -> None:
        """Sum these (sharded) parameters' squared norms with ``reduce`` before the ratio."""
        for p in params:
            self._reduce[id(p)] = reduce

    def norms(self, p: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return norms(p, update, self._reduce.get(id(p)))

    def gradient(self, p: torch.Tensor) -> torch.Tensor | None:
        """``p``'s gradient (None: skip it), refusing what the trust ratio cannot take: a norm
        of a sparse gradient or of a complex tensor's real part would be the wrong layer norm
        (a complex one was used silently, a sparse one failed deep inside the arithmetic)."""
        g = p.grad
        if g is None:
            return None
        name = type(self).__name__
        if g.is_sparse:
            raise RuntimeError(
                f"{name} does not support sparse gradients: build the layer dense (e.g. "
                "nn.Embedding(..., sparse=False)) or give it to another optimizer"
            )
        if torch.is_complex(p):
            raise RuntimeError(
                f"{name} does not support complex parameters: hold them as real pairs "
                "(torch.view_as_real) or give them to another optimizer"
            )
        return g


def norms(
    weight: torch.Tensor,
    update: torch.Tensor,
    reduce_norm: Callable[[torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(||weight||, ||update||)`` as 0-d tensors (float32 at least), over the whole tensor when
    ``reduce_norm`` sums squared norms over a shard group."""
    squares = torch.stack(
        [weight.detach().float().pow(2).sum(), update.detach().float().pow(2).sum()]
    )
    if reduce_norm is not None:
        reduce_norm(squares)
    roots = squares.sqrt()
    return roots[0], roots[1]


def safe_ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator``, or 1 where either is 0 (a fresh zero-initialised layer, or
    no gradient): the layer then takes the plain step, as LARS and LAMB implementations do."""
    ok = (numerator > 0) & (denominator > 0)
    return torch.where(ok, numerator / denominator.clamp_min(1e-30), torch.ones_like(numerator))
