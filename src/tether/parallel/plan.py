"""A sharding plan: which of the user's layers are split, and how; checked before anything runs.

A plan names layers by their module path in the user's model (``model.get_submodule``'s names,
e.g. ``"fc1"`` or ``"features.3"``) and gives each a kind:

- ``column``: a ``Linear``'s output features, or a ``Conv2d``'s output channels, are split;
- ``row``: a ``Linear``'s input features, or a ``Conv2d``'s input channels, are split;
- ``channel`` and ``input-channel``: the same two for ``Conv2d`` in convolution words.

On the command line and in a config file a plan is a list of ``name=kind`` strings
(``--parallel-plan fc1=column,fc2=row``); in Python a dict. Every mistake is one
:class:`~tether.errors.TetherError` line that says what to change, raised before any worker
starts: an unknown layer (the shardable ones are listed), a kind the layer has no rule for, a
size the model group does not divide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import nn
from torch.nn.utils import parametrize

from tether.errors import TetherError
from tether.parallel.layers import (
    ChannelParallelConv2d,
    ColumnParallelLinear,
    InputChannelParallelConv2d,
    RowParallelLinear,
    ShardedLayer,
)

KINDS = ("column", "row", "channel", "input-channel")
# The convolution words and the matrix words name the same two splits.
_CONV_KIND = {
    "column": "channel",
    "channel": "channel",
    "row": "input-channel",
    "input-channel": "input-channel",
}
_LINEAR_KIND = {"column": "column", "row": "row"}
_LISTED = 12  # shardable layer names listed in an error


def parse_plan(plan: Mapping[str, str] | Iterable[str] | str | None) -> dict[str, str]:
    """A plan as a dict ``layer name -> kind`` from a dict, ``name=kind`` strings, or one
    comma-separated string of them."""
    if plan is None:
        return {}
    if isinstance(plan, Mapping):
        items = [(str(k), str(v)) for k, v in plan.items()]
    else:
        texts = [plan] if isinstance(plan, str) else list(plan)
        entries = [part for text in texts for part in str(text).split(",") if part.strip()]
        items = []
        for entry in entries:
            name, sep, kind = str(entry).partition("=")
            if not sep or not name.strip() or not kind.strip():
                raise TetherError(
                    f"a parallel plan entry is layer=kind (e.g. fc1=column), got {entry!r}"
                )
            items.append((name.strip(), kind.strip()))
    parsed: dict[str, str] = {}
    for name, kind in items:
        if kind not in KINDS:
            raise TetherError(
                f"parallel plan: {name!r} has kind {kind!r}; kinds are {', '.join(KINDS)}"
            )
        if name in parsed:
            raise TetherError(f"parallel plan names layer {name!r} twice")
        parsed[name] = kind
    return parsed


def shardable_layers(model: nn.Module) -> list[str]:
    """The names of the layers a plan can split (``Linear`` and ``Conv2d``)."""
    return [
        n
        for n, m in model.named_modules()
        if type(m) in (nn.Linear, nn.Conv2d) and not parametrize.is_parametrized(m) and n
    ]


def layer_class(name: str, module: nn.Module, kind: str, parts: int) -> type[ShardedLayer]:
    """The sharded layer that replaces ``module`` (named ``name``) split ``kind``-wise into
    ``parts``; one TetherError line when it cannot be. Only plain ``Linear`` and ``Conv2d``:
    a subclass or a parametrised layer (weight_norm) computes its weight its own way, or is
    read by its owner directly (``MultiheadAttention.out_proj``), which a slice would break."""
    subclass = isinstance(module, nn.Linear | nn.Conv2d) and type(module) not in (
        nn.Linear,
        nn.Conv2d,
    )
    if subclass or parametrize.is_parametrized(module):
        shown = "a parametrised " if parametrize.is_parametrized(module) else "a "
        raise TetherError(
            f"parallel plan: {name} is {shown}{type(module).__name__}; only plain Linear and "
            "Conv2d layers can be split (not their subclasses, nor parametrised ones)"
        )
    if isinstance(module, nn.Linear):
        if kind not in _LINEAR_KIND:
            raise TetherError(
                f"parallel plan: {name} is a Linear layer, which splits 'column' or 'row', "
                f"not {kind!r}"
            )
        features = module.out_features if kind == "column" else module.in_features
        what = "output features" if kind == "column" else "input features"
        _check_divides(name, features, what, parts)
        return ColumnParallelLinear if kind == "column" else RowParallelLinear
    if isinstance(module, nn.Conv2d):
        conv_kind = _CONV_KIND[kind]
        if module.groups != 1 or module.padding_mode != "zeros":
            raise TetherError(
                f"parallel plan: {name} is a grouped or non-zero-padded Conv2d "
                f"(groups={module.groups}, padding_mode={module.padding_mode!r}); only "
                "groups=1 with zero padding can be split"
            )
        channels = module.out_channels if conv_kind == "channel" else module.in_channels
        what = "output channels" if conv_kind == "channel" else "input channels"
        _check_divides(name, channels, what, parts)
        return ChannelParallelConv2d if conv_kind == "channel" else InputChannelParallelConv2d
    raise TetherError(
        f"parallel plan: {name} is a {type(module).__name__}; only Linear and Conv2d layers "
        "can be split"
    )


def check_plan(model: nn.Module, plan: Mapping[str, str], parts: int) -> None:
    """Every entry of ``plan`` names a layer of ``model`` that splits into ``parts``."""
    if not plan:
        raise TetherError(
            "model parallelism needs a plan naming the layers to split, e.g. --parallel-plan "
            "fc1=column,fc2=row (parallel_plan={'fc1': 'column', 'fc2': 'row'} in Python; "
            f"this model's Linear/Conv2d layers: {_listed(model)})"
        )
    for name, kind in plan.items():
        layer_class(name, find_layer(model, name), kind, parts)


def find_layer(model: nn.Module, name: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise TetherError(
            f"parallel plan: the model has no layer {name!r}; its Linear/Conv2d layers are "
            f"{_listed(model)}"
        ) from None


def _listed(model: nn.Module) -> str:
    names = shardable_layers(model)
    shown = ", ".join(names[:_LISTED])
    return (shown + ", ...") if len(names) > _LISTED else (shown or "none")


def _check_divides(name: str, size: int, what: str, parts: int) -> None:
    if size % parts:
        raise TetherError(
            f"parallel plan: {name} has {size} {what}, which do not split into "
            f"{parts} equal parts; choose a model parallelism that divides {size}"
        )
