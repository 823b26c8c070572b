"""Counted nouns for what Tether prints: "1 worker", "4 workers", "3 processes"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, in the plural (``plural``, or the noun and an ``s``) unless ``n`` is
    1."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"
