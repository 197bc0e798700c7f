"""The bench runs from a checkout without the tests package: no bench module imports from ``tests``."""

import ast
import pathlib

import pytest

pytestmark = pytest.mark.unit

BENCH = pathlib.Path(__file__).resolve().parents[3] / "bench"


def _imports_tests(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [n for n in names if n == "tests" or n.startswith("tests.")]
    return found


def test_no_bench_module_imports_the_tests_package():
    offenders = {p.name: found for p in sorted(BENCH.glob("*.py")) if (found := _imports_tests(p))}
    assert offenders == {}
