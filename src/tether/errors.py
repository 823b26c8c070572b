"""User-facing errors.

A :class:`TetherError` is a mistake the user can fix (bad option, missing data, corrupt file).
The CLI prints its message as one line and exits with code 2, without a traceback. Internal invariants use ``assert``; bugs stay tracebacks.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Iterable, Mapping


class TetherError(Exception):
    """A user error: the message says what was wrong and how to fix it, in one line."""


class SettingError(TetherError):
    """A setting's value refused: the message begins with its config key (``key``), which a
    command line says as the option the user typed (``--checkpoint-every must be >= 0``). Its
    advice may name the settings to change as ``{options}``: ``options``' keys, "a, b or c"."""

    def __init__(self, key: str, message: str, options: tuple[str, ...] = ()) -> None:
        self.key = key
        self.template = message
        self.options = options
        super().__init__(self._with_options({}))

    def _with_options(self, said: Mapping[str, str]) -> str:
        names = [said.get(key, key) for key in self.options]
        return self.template.replace("{options}", one_of(names) if names else "")

    def with_value(self, value: object) -> SettingError:
        """The refusal with the value refused (``, got -1``), where its rule does not say it:
        one that begins ``key must`` (not ``key (6) must ...``, nor one with a ``got``)."""
        if " got " in self.template or not self.template.startswith(f"{self.key} must "):
            return self
        return SettingError(self.key, f"{self.template}, got {value!r}", self.options)

    def respelled(
        self, said: Mapping[str, str], advised: Mapping[str, str] | None = None
    ) -> TetherError:
        """The same refusal with each setting of ``said`` (key: how to say it) that it names
        said so: the one it begins with and any other before its value in brackets
        (``ranks_per_node (4)``); those its advice names as ``advised`` says them (default:
        ``said``; a command's flags, whether typed or not)."""
        text = self._with_options(said if advised is None else advised)
        for key, words in said.items():
            text = re.sub(rf"^{key}(?= )|(?<![\w-]){key}(?= \([-\d])", words, text)
        return TetherError(text)


def one_of(names: Iterable[str]) -> str:
    """``"a, b or c"``: the choices a refusal names."""
    *rest, last = names
    return f"{', '.join(rest)} or {last}" if rest else last


def first_line(exc: BaseException) -> str:
    """``exc`` as one line of a TetherError's message: its type and its message's first line
    (a user's component that failed, without its traceback)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class WorkerFailure(Exception):
    """One or more worker processes failed; the message names the ranks and their errors."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


def warnings_in_one_line() -> None:
    """Show warnings as one line each on stderr, like the errors (``tether: warning: ...``),
    not Python's two lines pointing inside Tether: for the command lines, whose users did not
    write the code a warning would point at."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        del category, filename, lineno, file, line
        print(f"tether: warning: {message}", file=sys.stderr)

    warnings.showwarning = show
