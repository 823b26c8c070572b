"""Name -> component registries, for the families a user picks from by name.

Registries exist only where a user chooses one of a family (methods, models, datasets, and later
collectives and compressors). A failed lookup is a :class:`TetherError`
that lists every valid name, so a typo on the command line is fixed in one go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from tether.errors import TetherError

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered map from a user-visible name to a component (usually a builder).

    ``kind`` is the word used in error messages ("method", "model", ...); ``also`` lists names
    the caller accepts besides the registered ones (``auto`` for the optimizer: the method's own
    step), so that an error lists every choice a user has.
    """

    def __init__(self, kind: str, plural: str | None = None, also: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self.also = also
        self._items: dict[str, T] = {}
        self._help: dict[str, str] = {}

    def register(self, name: str, help: str = "") -> Callable[[T], T]:
        """Decorator: register ``obj`` under ``name``; a name can be registered only once."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            self._help[name] = help or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            valid = ", ".join([*self._items, *self.also])
            raise TetherError(
                f"unknown {self.kind} {name!r}; valid {self.plural}: {valid}"
            ) from None

    def names(self) -> list[str]:
        return list(self._items)

    def describe(self, name: str) -> str:
        """One line of help for ``name`` (the first docstring line unless given explicitly)."""
        self.get(name)
        return self._help[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
