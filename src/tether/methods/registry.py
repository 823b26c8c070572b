"""The method registry (kept apart from the methods so each method module can register itself)."""

from __future__ import annotations

from tether.registry import Registry

METHODS: Registry = Registry("method")
