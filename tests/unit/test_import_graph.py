"""The house: data flows one way through ``src/tether``.

Every import statement counts, module level or inside a function or a ``TYPE_CHECKING`` block: a
cycle anywhere fails the test, and so does an arrow pointing up the layers (config and comm are
leaves, observe does not reach the transport, methods do not read the launcher's environment).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tether

ROOT = Path(tether.__file__).parent


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ``tether`` it imports (each resolved to an existing module)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("tether")}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module.startswith("tether"):
                    for alias in node.names:
                        full = f"{module}.{alias.name}"
                        targets.add(full if full in modules else module)
        resolved = set()
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                resolved.add(target)
        graph[name] = resolved
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _reach(graph: dict[str, set[str]], prefix: str) -> set[str]:
    return {
        f"{a} -> {b}"
        for a, targets in graph.items()
        if a == prefix or a.startswith(prefix + ".")
        for b in targets
    }


def test_no_import_cycle_anywhere() -> None:
    assert cycles(import_graph()) == []


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_upward_arrows() -> None:
    graph = import_graph()
    leaf = ("tether.config", "tether.targets", "tether.errors", "tether.registry")
    assert {t for t in graph["tether.config"] if t not in leaf} == set()
    assert {t for t in graph["tether.targets"] if t not in leaf} == set()
    assert graph["tether.spelling"] == set()  # imported by perf, which is pure
    # where a config's values come from reads the config, not the other way round
    assert "tether.config_sources" not in graph["tether.config"]
    forbidden = {
        "tether.comm": ("tether.config", "tether.launch", "tether.methods", "tether.perf"),
        "tether.observe": ("tether.comm", "tether.methods", "tether.training", "tether.launch"),
        "tether.methods": ("tether.launch", "tether.training", "tether.catalog", "tether.cli"),
        "tether.training": ("tether.launch", "tether.catalog", "tether.cli", "tether.api"),
        "tether.launch": ("tether.methods", "tether.training", "tether.catalog", "tether.cli"),
        "tether.data": ("tether.methods", "tether.training", "tether.comm"),
        "tether.models": ("tether.methods", "tether.training", "tether.comm", "tether.data"),
        "tether.optim": ("tether.methods", "tether.training", "tether.comm"),
        "tether.perf": ("tether.comm.transport", "tether.launch", "tether.methods"),
        # model parallelism sits on the transports, below the methods that run over its grid
        "tether.parallel": ("tether.methods", "tether.training", "tether.launch", "tether.api"),
    }
    bad = []
    for layer, above in forbidden.items():
        for edge in _reach(graph, layer):
            target = edge.split(" -> ")[1]
            if any(target == a or target.startswith(a + ".") for a in above):
                bad.append(edge)
    assert bad == []


def test_the_performance_model_imports_nothing_that_runs() -> None:
    """perf is pure: profiles, formulas, the DAG model and the simulator, no torch and nothing of
    tether's outside itself but its errors and how they name a setting (tether.spelling; the
    timing lives in tether.bench)."""
    graph = import_graph()
    edges = _reach(graph, "tether.perf")
    assert edges, "the graph lost tether.perf"
    outside = [
        e
        for e in edges
        if not (
            e.split(" -> ")[1].startswith("tether.perf")
            or e.endswith(("-> tether.errors", "-> tether.spelling"))
        )
    ]
    assert outside == []
    for path in (ROOT / "perf").rglob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and not node.level
        }
        assert "torch" not in imported, path


def test_the_documented_subpackages_need_no_import_of_their_own() -> None:
    # docs/large_batch.md writes tether.optim.LARS after a plain `import tether`: before, that
    # was an AttributeError in a fresh interpreter (it worked once tether.init had loaded it).
    code = "import tether; print(tether.optim.LARS.__name__, tether.metrics.accuracy.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.split() == ["LARS", "accuracy"], done.stderr
