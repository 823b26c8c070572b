"""Import paths ``module:attribute``: how the command line names a user's own component.

Wherever a name is accepted (``--model``, ``--dataset``, ``--loss``, ``--optimizer``,
``--lr-schedule``, ``--metric``), ``package.module:attribute`` names an object in the user's code,
looked up on the working directory and ``PYTHONPATH`` (in every worker process as well). A path
that does not resolve is one line saying which part was not found.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from tether.errors import TetherError


def is_import_path(text: str) -> bool:
    """``module:attr`` (a registered name never contains a colon)."""
    return ":" in text


def load_object(path: str, what: str) -> Any:
    """The object at ``module:attr[.attr...]``; ``what`` ("model", "loss", ...) names the option
    in errors. The working directory is searched first, as ``python -m`` would."""
    module_name, _, attr_path = path.partition(":")
    if not module_name or not attr_path:
        raise TetherError(
            f"{what} {path!r}: an import path is module:attribute, e.g. mypkg.nets:Net"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        raise TetherError(
            f"{what} {path!r}: no module named {missing!r} (looked in the working directory "
            f"{cwd} and PYTHONPATH)"
        ) from None
    except Exception as exc:  # the user's module raised while importing
        raise TetherError(
            f"{what} {path!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise TetherError(
                f"{what} {path!r}: module {module_name} has no attribute {attr_path!r}"
            )
        obj = getattr(obj, part)
    return obj
