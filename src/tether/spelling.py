"""How a message names a setting for the one who reads it: ``tether.fit`` and ``tether.init``
take keywords (``lr_schedule="step"``), the command line takes flags (``--lr-schedule step``:
:func:`as_dashed`, or :func:`tether.train_options.as_flag` for ``tether train``'s options, whose
flags are not all the key dashed and some of which have none of their own). An error or
warning that tells the user what to set says it in their own words: a flag means nothing to a
notebook. A check that cannot know its caller (in a worker) gives both (:func:`both_ways`)."""

from __future__ import annotations

from pathlib import PurePath
from typing import Protocol


class Spell(Protocol):
    """Names config key ``key`` (set to ``value``, where given) as the reader would write it."""

    def __call__(self, key: str, value: object = None) -> str: ...


def as_keyword(key: str, value: object = None) -> str:
    """The Python API's spelling: ``lr``, ``optimizer='sgd'``, ``out='runs/a'`` (a path as
    the string one would write)."""
    if isinstance(value, PurePath):
        value = str(value)
    return key if value is None else f"{key}={value!r}"


def as_dashed(key: str, value: object = None) -> str:
    """A command line's spelling where every setting has its own flag: ``--bucket-mb 4``."""
    flag = "--" + key.replace("_", "-")
    return flag if value is None else f"{flag} {value}"


def both_ways(**settings: object) -> str:
    """Settings to give, in a message either the command line or Python may have led to (a
    check in a worker knows no caller): ``--workers 4 --batch-size 64 (workers=4,
    batch_size=64 in Python)``."""
    flags = " ".join(as_dashed(key, value) for key, value in settings.items())
    words = ", ".join(as_keyword(key, value) for key, value in settings.items())
    return f"{flags} ({words} in Python)"
