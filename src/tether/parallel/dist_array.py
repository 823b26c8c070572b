"""DistArray: an activation spread over a model group, moved only when a consumer needs it whole.

COTS HPC (Coates et al., ICML 2013, section 4) hid the traffic of model parallelism inside a
"distributed array": each worker owns a slice of a layer's outputs, and the communication that
feeds the next layer happens inside the array object, so layer code reads like single-device
code. A :class:`DistArray` is that object for a PyTorch forward pass: this rank's local tensor,
its :class:`Layout` over the group (``sharded`` along one dimension, ``partial`` sums still to be
added, or ``replicated``), and the group.

It is a *tensor-like* (it implements ``__torch_function__`` without subclassing ``Tensor``), so
the user's own forward code runs on it unchanged:

- functions that act on each element or each channel alone keep the layout and move nothing:
  activations (``relu``, ``gelu``, ``tanh``, ...), dropout, 2-D pooling of channel-sharded
  images, ``flatten`` from the sharded dimension on (the channel slices of a flattened image are
  contiguous feature slices, exactly what a row-parallel layer takes), and arithmetic with a
  number or with an array of the same layout;
- a sharded-aware layer (:mod:`tether.parallel.layers`) takes the array as it is;
- anything else sees the whole tensor: the array gathers (or sums) itself first, through the
  autograd-aware collectives of :mod:`tether.parallel.mappings`, so the result is always right,
  and only costs the communication the consumer needed.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tether.comm.transport import Transport
from tether.errors import TetherError
from tether.parallel.mappings import gather_from_shards, reduce_from_shards, scatter_to_shards

# Functions of one array that act on each element alone: any layout but partial sums keeps.
_ELEMENTWISE = frozenset(
    {
        "relu",
        "relu_",
        "relu6",
        "gelu",
        "silu",
        "tanh",
        "sigmoid",
        "leaky_relu",
        "elu",
        "selu",
        "celu",
        "hardtanh",
        "hardswish",
        "hardsigmoid",
        "softplus",
        "mish",
        "neg",
    }
)
# 2-D pooling acts within each channel: it keeps images (N, C, H, W) sharded along N or C.
_POOLING = frozenset({"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d"})
_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
}
_LINEAR_IN_SCALARS = frozenset({"mul", "div"})  # partial sums stay partial sums


def _layout_arithmetic(name: str, reflected: bool = False) -> Callable[[Any, Any], Any]:
    """``self <op> other`` (or ``other <op> self``) by :func:`_arithmetic`'s layout rules."""

    def method(self: Any, other: Any) -> Any:
        return _arithmetic(name, other, self) if reflected else _arithmetic(name, self, other)

    return method


def _on_whole(op: Callable[..., Any], reflected: bool = False) -> Callable[..., Any]:
    """``op`` on the whole tensor (and on the whole of any array among the other operands)."""

    def method(self: Any, *others: Any) -> Any:
        if reflected:
            return op(DistArray.whole(others[0]), self.full())
        return op(self.full(), *DistArray.whole(others))

    return method


@dataclass(frozen=True)
class Layout:
    """How a tensor is spread over a group: ``sharded`` (equal slices along ``dim``, in rank
    order), ``partial`` (every rank holds a summand of the whole) or ``replicated``."""

    kind: str
    dim: int | None = None

    @staticmethod
    def sharded(dim: int) -> Layout:
        return Layout("sharded", dim)

    def __str__(self) -> str:
        return f"sharded(dim={self.dim})" if self.kind == "sharded" else self.kind


REPLICATED = Layout("replicated")
PARTIAL = Layout("partial")


class DistArray:
    """This rank's part of a tensor spread over ``group`` (see the module's docstring)."""

    def __init__(self, local: torch.Tensor, layout: Layout, group: Transport) -> None:
        if layout.kind == "sharded":
            assert layout.dim is not None and 0 <= layout.dim < local.dim(), layout
        self.local = local
        self.layout = layout
        self.group = group

    # -- what it is --------------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        """The whole tensor's shape."""
        if self.layout.kind != "sharded":
            return self.local.shape
        assert self.layout.dim is not None
        shape = list(self.local.shape)
        shape[self.layout.dim] *= self.group.world_size
        return torch.Size(shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.local.dim()

    @property
    def ndim(self) -> int:
        return self.local.dim()

    @property
    def dtype(self) -> torch.dtype:
        return self.local.dtype

    @property
    def device(self) -> torch.device:
        return self.local.device

    @property
    def requires_grad(self) -> bool:
        return self.local.requires_grad

    def __len__(self) -> int:
        return int(self.shape[0])

    def __repr__(self) -> str:
        return (
            f"DistArray(shape={tuple(self.shape)}, layout={self.layout}, "
            f"rank {self.group.rank} of {self.group.world_size}, local={tuple(self.local.shape)})"
        )

    # -- moving it ---------------------------------------------------------------------------
    def full(self) -> torch.Tensor:
        """The whole tensor on every rank (all-gather of the slices, or all-reduce of partial
        sums; autograd sends the gradient back the conjugate way)."""
        if self.layout.kind == "sharded":
            assert self.layout.dim is not None
            return gather_from_shards(self.local, self.group, self.layout.dim)
        if self.layout.kind == "partial":
            return reduce_from_shards(self.local, self.group)
        return self.local

    def shard(self, dim: int) -> torch.Tensor:
        """This rank's slice along ``dim`` (the local tensor when already sharded so)."""
        dim %= self.local.dim()
        if self.layout == Layout.sharded(dim):
            return self.local
        return scatter_to_shards(self.full(), self.group, dim)

    @staticmethod
    def whole(value: Any) -> Any:
        """``value`` with every DistArray in it (also inside lists, tuples and dicts) made whole."""
        if isinstance(value, DistArray):
            return value.full()
        if isinstance(value, list | tuple):
            items = [DistArray.whole(v) for v in value]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value  # nothing inside was an array: the container as it was
            if hasattr(value, "_fields"):  # a namedtuple takes its fields one by one
                return type(value)(*items)
            return type(value)(items)
        if isinstance(value, dict):
            entries = {k: DistArray.whole(v) for k, v in value.items()}
            if all(entries[k] is v for k, v in value.items()):
                return value
            out = copy.copy(value)  # keeps a dict subclass's type
            out.update(entries)
            return out
        return value

    def _keep(self, local: torch.Tensor, layout: Layout | None = None) -> DistArray:
        return DistArray(local, layout or self.layout, self.group)

    # -- torch functions ---------------------------------------------------------------------
    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if isinstance(first, DistArray) and not any(
            isinstance(a, DistArray) for a in (*args[1:], *kwargs.values())
        ):
            kept = first._layout_keeping(name, func, args[1:], kwargs)
            if kept is not None:
                return kept
        if name in _ARITHMETIC and len(args) == 2 and not kwargs:
            return _arithmetic(name, args[0], args[1])
        return func(*DistArray.whole(args), **DistArray.whole(kwargs))

    def _layout_keeping(
        self, name: str, func: Callable[..., Any], rest: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> DistArray | None:
        """``func(self, *rest)`` run on the local tensor when that keeps the layout, else None."""
        kind = self.layout.kind
        if name == "dropout" and kind == "sharded":
            return self._dropout(*rest, **kwargs)
        if name in _ELEMENTWISE and kind != "partial":
            return self._keep(func(self.local, *rest, **kwargs))
        pooled_dims = (0, 1) if kind == "sharded" else ()
        if name in _POOLING and self.local.dim() == 4 and self.layout.dim in pooled_dims:
            out = func(self.local, *rest, **kwargs)
            return self._keep(out) if isinstance(out, torch.Tensor) else None
        if name == "flatten":
            return self._flattened(*rest, **kwargs)
        return None

    def _dropout(self, p: float = 0.5, training: bool = True, inplace: bool = False) -> DistArray:
        """Dropout of a sharded activation with this rank's slice of the mask the whole tensor
        would draw: every rank of the group draws the whole mask from the same random state (as
        ``F.dropout`` on the whole tensor does, element for element), so the slices' masks are
        independent of each other, the ranks' random states stay equal, and the result is the
        unsharded model's."""
        del inplace  # the local tensor is not changed in place: the mask multiplies a copy
        if not training or p == 0:
            return self
        if p == 1:
            return self._keep(torch.zeros_like(self.local))
        mask = torch.empty(self.shape, dtype=self.local.dtype, device=self.local.device)
        mask.bernoulli_(1 - p).div_(1 - p)
        dim = self.layout.dim
        assert dim is not None
        step = self.local.shape[dim]
        return self._keep(self.local * mask.narrow(dim, self.group.rank * step, step))

    # -- methods the models' forward code calls ----------------------------------------------
    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Any:
        kept = self._flattened(start_dim, end_dim)
        return kept if kept is not None else self.full().flatten(start_dim, end_dim)

    def _flattened(self, start_dim: int = 0, end_dim: int = -1) -> DistArray | None:
        """Flattening dims ``start..end`` keeps a sharding along ``dim`` when ``dim`` is outside
        them, or is ``start`` itself: then each rank's block of the merged dimension is its
        slice's elements in order, a contiguous slice of the whole."""
        if self.layout.kind != "sharded":
            return self._keep(self.local.flatten(start_dim, end_dim))
        ndim, dim = self.local.dim(), self.layout.dim
        assert dim is not None
        start, end = start_dim % ndim, end_dim % ndim
        if dim < start or dim == start:
            new_dim = dim
        elif dim > end:
            new_dim = dim - (end - start)
        else:
            return None
        return self._keep(self.local.flatten(start, end), Layout.sharded(new_dim))

    def view(self, *shape: Any) -> Any:
        return self._reshaped("view", shape)

    def reshape(self, *shape: Any) -> Any:
        return self._reshaped("reshape", shape)

    def _reshaped(self, how: str, shape: tuple[Any, ...]) -> Any:
        """``x.view(x.size(0), -1)`` and the like: a reshape that keeps the dimensions before
        the sharded one and merges it with all after it is a flatten from there; any other
        shape is taken of the whole tensor."""
        sizes = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], list | tuple) else shape
        dim = self.layout.dim
        if (
            self.layout.kind == "sharded"
            and dim is not None
            and len(sizes) == dim + 1
            and tuple(sizes[:dim]) == tuple(self.shape[:dim])
            and sizes[dim] in (-1, self.shape[dim:].numel())
        ):
            return self._keep(self.local.flatten(dim), Layout.sharded(dim))
        return getattr(self.full(), how)(*sizes)

    def relu(self) -> Any:
        return (
            self._keep(self.local.relu()) if self.layout.kind != "partial" else self.full().relu()
        )

    def __getattr__(self, name: str) -> Any:
        # Any other tensor attribute or method: of the whole tensor (always right; it costs the
        # gather or reduction the caller asked for).
        if name.startswith("__") or name in ("local", "layout", "group"):
            raise AttributeError(name)
        if name.endswith("_"):  # it would change a gathered copy, not this array
            raise TetherError(
                f"x.{name}() on an activation split by model parallelism would change a "
                f"gathered copy: write x = x.{name[:-1]}(...) instead"
            )
        return getattr(self.full(), name)

    # -- operators ---------------------------------------------------------------------------
    # Python looks operators up on the type, not through __getattr__, so each is spelled out.
    # + - * / keep a layout where they can (_arithmetic); every other operator (powers,
    # indexing, comparisons, ...) takes the whole tensor, as an unknown torch function does.
    __add__ = _layout_arithmetic("add")
    __radd__ = _layout_arithmetic("add", reflected=True)
    __sub__ = _layout_arithmetic("sub")
    __rsub__ = _layout_arithmetic("sub", reflected=True)
    __mul__ = _layout_arithmetic("mul")
    __rmul__ = _layout_arithmetic("mul", reflected=True)
    __truediv__ = _layout_arithmetic("div")
    __rtruediv__ = _on_whole(operator.truediv, reflected=True)
    __pow__ = _on_whole(operator.pow)
    __rpow__ = _on_whole(operator.pow, reflected=True)
    __matmul__ = _on_whole(operator.matmul)
    __rmatmul__ = _on_whole(operator.matmul, reflected=True)
    __floordiv__ = _on_whole(operator.floordiv)
    __rfloordiv__ = _on_whole(operator.floordiv, reflected=True)
    __mod__ = _on_whole(operator.mod)
    __rmod__ = _on_whole(operator.mod, reflected=True)
    __and__ = _on_whole(operator.and_)
    __rand__ = _on_whole(operator.and_, reflected=True)
    __or__ = _on_whole(operator.or_)
    __ror__ = _on_whole(operator.or_, reflected=True)
    __xor__ = _on_whole(operator.xor)
    __rxor__ = _on_whole(operator.xor, reflected=True)
    __getitem__ = _on_whole(operator.getitem)
    __abs__ = _on_whole(operator.abs)
    __pos__ = _on_whole(operator.pos)
    __invert__ = _on_whole(operator.invert)
    __lt__ = _on_whole(operator.lt)
    __le__ = _on_whole(operator.le)
    __gt__ = _on_whole(operator.gt)
    __ge__ = _on_whole(operator.ge)
    __eq__ = _on_whole(operator.eq)  # elementwise, as a tensor's
    __ne__ = _on_whole(operator.ne)
    __hash__ = object.__hash__  # still a usable key, its == being elementwise

    def __neg__(self) -> Any:
        return _arithmetic("mul", self, -1)


def _arithmetic(name: str, left: Any, right: Any) -> Any:
    """``left <op> right`` where at least one side is a DistArray: on the local tensors when the
    result has a layout of its own (two arrays of one sharding, or partial sums added; an array
    that is not partial sums with a number; partial sums times or over a number), else on the
    whole tensors."""
    op = _ARITHMETIC[name]
    arrays = [v for v in (left, right) if isinstance(v, DistArray)]
    if len(arrays) == 2:
        a, b = arrays
        same = a.layout == b.layout and a.local.shape == b.local.shape
        linear = a.layout.kind == "partial" and name in ("add", "sub")
        if same and (a.layout.kind == "sharded" or linear):
            return a._keep(op(a.local, b.local))
    else:
        array = arrays[0]
        number = right if array is left else left
        if isinstance(number, int | float):
            scalar_ok = array.layout.kind != "partial" or (
                name in _LINEAR_IN_SCALARS and (array is left or name == "mul")
            )
            if scalar_ok:
                local = op(array.local, number) if array is left else op(number, array.local)
                return array._keep(local)
    return op(DistArray.whole(left), DistArray.whole(right))
