"""The README's measured numbers come from result files: every marked block is exactly what
``benchmarks/bench_readme.py`` renders from the file it names (a number typed by hand fails)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def bench_readme() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its sibling _common
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_readme", ROOT / "benchmarks/bench_readme.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_readme_blocks_are_rendered_from_their_result_files() -> None:
    module = bench_readme()
    text = (ROOT / "README.md").read_text()
    names = [m["name"] for m in module.BLOCK.finditer(text)]
    assert names == ["demo", "first-example"]
    assert module.readme_with_runs(text) == text, (
        "run benchmarks/bench_readme.py --reuse --update-readme"
    )


def test_a_number_typed_by_hand_is_caught() -> None:
    module = bench_readme()
    text = (ROOT / "README.md").read_text()
    block = next(module.BLOCK.finditer(text))
    tampered = text[: block.start("body")] + "test accuracy 99.99%\n" + text[block.end("body") :]
    assert module.readme_with_runs(tampered) == text
