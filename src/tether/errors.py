"""User-facing errors.

A :class:`TetherError` is a mistake the user can fix (bad option, missing data, corrupt file).
The CLI prints its message as one line and exits with code 2, without a traceback. Internal invariants use ``assert``; bugs stay tracebacks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping


class TetherError(Exception):
    """A user error: the message says what was wrong and how to fix it, in one line."""


class SettingError(TetherError):
    """A setting's value refused: the message begins with its config key (``key``), which a
    command line says as the option the user typed (``--checkpoint-every must be >= 0``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key

    def respelled(self, said: Mapping[str, str]) -> TetherError:
        """The same refusal with each setting of ``said`` (key: how to say it) that it names
        said so: the one it begins with, and any other before its value in brackets
        (``ranks_per_node (4)``)."""
        text = str(self)
        for key, words in said.items():
            text = re.sub(rf"^{key}(?= )|(?<![\w-]){key}(?= \([-\d])", words, text)
        return TetherError(text)


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
