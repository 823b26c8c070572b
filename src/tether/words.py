"""Counted nouns for what Tether prints: "1 worker", "4 workers"."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless ``n`` is 1 (the nouns printed take an ``s``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
