"""User-facing errors.

A :class:`TetherError` is a mistake the user can fix (bad option, missing data, corrupt file).
The CLI prints its message as one line and exits with code 2, without a traceback. Internal invariants use ``assert``; bugs stay tracebacks.
"""

from __future__ import annotations


class TetherError(Exception):
    """A user error: the message says what was wrong and how to fix it, in one line."""


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
