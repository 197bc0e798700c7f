"""No service package imports another service's package (docs/architecture.md, "One codebase, two shapes").

A service may import ``services.common``, the generated stubs (``meshfront.*``), its own package and
third-party libraries. What composes several services (the all-in-one process, services/allinone;
the launcher) lives above them. Every import counts, function-local ones included.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "preprocessor", "router", "postprocessor", "workers")


def imported_modules(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[tuple[int, str]]:
    """Every absolute module an ``import``/``from ... import`` names, anywhere in the file; relative
    imports are resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = list(path.relative_to(root).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module == "services":  # "from services import router" names the package
                out += [(node.lineno, f"services.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, module))
    return sorted(out)


def crossings(service: str, root: pathlib.Path = ROOT) -> list[str]:
    allowed = {"common", service}
    bad = []
    for path in sorted((root / "services" / service).rglob("*.py")):
        for line, module in imported_modules(path, root):
            parts = module.split(".")
            if parts[0] == "services" and (len(parts) < 2 or parts[1] not in allowed):
                bad.append(f"{path.relative_to(root)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service):
    assert crossings(service) == []


def test_the_check_sees_function_local_and_relative_imports(tmp_path):
    pkg = tmp_path / "services" / "gateway"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("def f():\n    from services.router.service import Router\n"
                              "from ..postprocessor import service\nfrom services import workers\n"
                              "import services.common.flags\nfrom . import config\n")
    found = crossings("gateway", tmp_path)
    assert [f.split(" imports ")[1] for f in found] == ["services.router.service", "services.postprocessor",
                                                         "services.workers"]
