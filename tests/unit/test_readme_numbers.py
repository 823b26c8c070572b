"""The README's measured numbers come from result files: every marked block is exactly what
``benchmarks/bench_readme.py`` renders from the file it names (a number typed by hand fails)."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def bench_readme() -> ModuleType:
    return load_benchmark("bench_readme")


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


# A measured quantity: a number with its unit (a ratio, a percentage, seconds, bytes). The file
# must hold the number itself (its tables put the unit in the column's header): 4.1 is not 4.11.
MEASURED = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:%|x\b| s\b| ms\b| GiB\b| MiB\b)")
CITED = re.compile(r"benchmarks/results/([\w*.-]+)|`([\w*-]+_amd-epyc-2cores[\w.-]*\.md)`")


def cited_numbers_not_in_their_files(text: str) -> list[str]:
    """Each README paragraph that cites result files: its measured numbers that none of those
    files holds as written (the same digits, not part of a longer number)."""
    missing = []
    for paragraph in re.split(r"\n\s*\n", text):
        names = {a or b for a, b in CITED.findall(paragraph)}
        files = [p for name in names for p in sorted((ROOT / "benchmarks/results").glob(name))]
        if not files:
            continue
        held = "".join(p.read_text() for p in files if p.suffix in (".md", ".json", ".jsonl"))
        missing += [
            f"{match.group(0)!r} (cites {', '.join(sorted(names))})"
            for match in MEASURED.finditer(paragraph)
            if not re.search(rf"(?<![\d.]){re.escape(match.group(1))}(?!\d|\.\d)", held)
        ]
    return missing


def test_numbers_next_to_a_result_file_are_in_that_file() -> None:
    """A README paragraph that cites a result file quotes its numbers as the file has them: a
    number typed by hand, rounded or derived elsewhere, or left behind when the file was
    regenerated, fails here."""
    text = (ROOT / "README.md").read_text()
    assert cited_numbers_not_in_their_files(text) == []
    made_up = (
        "Measured (`benchmarks/results/memory_workers_amd-epyc-2cores.md`): 3.9 GiB, 1.87x, 4 GiB."
    )
    assert cited_numbers_not_in_their_files(made_up) == [
        "'3.9 GiB' (cites memory_workers_amd-epyc-2cores.md)",
        "'4 GiB' (cites memory_workers_amd-epyc-2cores.md)",  # 4.11 rounded
    ]
