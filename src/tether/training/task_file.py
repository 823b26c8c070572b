"""Hand the caller's task to the worker processes of ``tether.fit``: pickled to a private file.

The model factory, datasets, loss and the rest are the caller's Python objects, so they cross to
the workers the way ``multiprocessing`` sends objects to spawned processes: by pickle, with
functions and classes pickled by reference (module and name). What the caller defined in the
script it ran is in ``__main__``; a worker first imports that script under the name
``__mp_main__`` (so its ``if __name__ == "__main__":`` block does not run again) and makes it its
``__main__``, exactly as a spawned ``multiprocessing`` child does, then unpickles the task.

This is local inter-process communication between a parent and the children it starts, through a
file only the user can read; nothing here ever travels on the network (Tether's wire protocol has
no pickle) and no checkpoint is read this way.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import runpy
import sys
import types
from pathlib import Path
from typing import Any

from tether.errors import TetherError
from tether.training.task import Task

MP_MAIN = "__mp_main__"


def _main_reference() -> dict[str, str | None]:
    """How a worker finds the caller's ``__main__``: a module name (``python -m``) or a file."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name and name != "__main__":
        return {"module": name.removesuffix(".__main__"), "path": None}
    path = getattr(main, "__file__", None)
    # `python - < script.py` names its __main__ "<stdin>": no file a worker could import
    file = os.path.abspath(path) if path and os.path.isfile(path) else None
    return {"module": None, "path": file}


def uses_main(data: bytes) -> bool:
    """Whether a pickle refers to objects of ``__main__`` (functions or classes defined in the
    script or session that called us)."""
    for _, arg, _ in pickletools.genops(data):
        if isinstance(arg, str) and (arg == "__main__" or arg.startswith("__main__ ")):
            return True
    return False


def pickle_argument(name: str, value: Any) -> bytes:
    """``value`` pickled, or a one-line error naming the argument and what to do."""
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "not picklable"
        raise TetherError(
            f"{name} cannot be sent to the worker processes ({type(exc).__name__}: {reason}): "
            "define it at the top level of a module or script (not inside a function, not a "
            "lambda) and keep open files, locks and generators out of it"
        ) from None
    if uses_main(data) and _main_reference() == {"module": None, "path": None}:
        raise TetherError(
            f"{name} is defined in an interactive session, which the worker processes cannot "
            "import: put it in a .py file (a module, or the script that calls tether.fit)"
        )
    return data


def _fields(task: Task) -> list[tuple[str, Any]]:
    named = [(f, getattr(task, f)) for f in ("model", "train_data", "eval_data", "loss")]
    named += [("optimizer", task.optimizer), ("scheduler", task.scheduler)]
    named += [(f"metric {k!r}", v) for k, v in (task.metrics or {}).items()]
    return [*named, ("collate_fn", task.collate_fn), ("loader_options", task.loader_options)]


def write_task(task: Task, path: Path) -> None:
    """The task to a file only the user can read; an argument that cannot make the trip is a
    one-line error naming it, before any worker starts."""
    try:
        data = pickle_argument("the task", task)
    except TetherError:
        for name, value in _fields(task):  # name the argument that failed
            pickle_argument(name, value)
        raise
    payload = {"main": _main_reference(), "task": data}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        pickle.dump(payload, handle, protocol=pickle.HIGHEST_PROTOCOL)


def _import_main(reference: dict[str, str | None]) -> None:
    """Make the caller's script (or module) this process's ``__main__``, as multiprocessing's
    spawn does; nothing to do when spawn did it already (``__main__`` is that file)."""
    module_name, path = reference.get("module"), reference.get("path")
    current = sys.modules.get("__main__")
    current_file = getattr(current, "__file__", None)
    if path and current_file and os.path.abspath(current_file) == path:
        return
    spec = getattr(current, "__spec__", None)
    if module_name and getattr(spec, "name", None) in (module_name, f"{module_name}.__main__"):
        return
    if module_name:
        content = runpy.run_module(module_name, run_name=MP_MAIN, alter_sys=True)
    elif path:
        content = runpy.run_path(path, run_name=MP_MAIN)
    else:
        return
    main = types.ModuleType(MP_MAIN)
    main.__dict__.update(content)
    sys.modules["__main__"] = sys.modules[MP_MAIN] = main


def read_task(path: Path) -> Task:
    """The task a parent wrote with :func:`write_task` (the parent's own file)."""
    with path.open("rb") as handle:
        payload = pickle.load(handle)  # our parent's file: see the module docstring
    _import_main(payload["main"])
    task = pickle.loads(payload["task"])
    if not isinstance(task, Task):
        raise TetherError(f"{path} does not hold a Tether task")
    return task
