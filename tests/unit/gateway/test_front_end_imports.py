"""Front ends are siblings: none imports another, and what they share imports none of them.

The gateway's layers (services/gateway/README.md, "The layout"):

- a front end (one folder per API) imports its own modules, the shared layer and services/common;
- the shared layer is ``core/``, ``media/`` and the gateway-wide modules at services/gateway/*.py
  (``front_door.py``, the stage clients, the metrics, ...): it imports no front end, so a front end
  cannot reach another through it either;
- above both sit the modules that put the gateway together or describe all of it: ``assembly.py``,
  ``main.py``, ``config.py`` (its flags, which load the extension code they name), ``warmup.py`` (first
  requests, in OpenAI's shape), ``http_api/`` (the route registry and the OpenAPI schemas, which read each
  parser's allowed values so the document cannot drift from it), ``edge/`` (which serves that document, /docs
  and the gateway-wide /metrics) and ``extensions/`` (extension code's routes, checked against the route
  registry, and the chat engine factory). Nothing below imports them.

Imports are read with ``ast``, so one made inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.unit

GATEWAY = pathlib.Path(__file__).resolve().parents[3] / "services" / "gateway"
PACKAGE = "services.gateway"
FRONT_ENDS = ("openai", "anthropic", "responses_api", "embeddings", "images", "videos", "kserve", "batch")
ABOVE = ("assembly", "main", "__main__", "config", "warmup", "http_api", "edge", "extensions")
SHARED_PACKAGES = ("core", "media", "auth")


def gateway_imports(source: str) -> set[str]:
    """The top-level part of services/gateway each import names: ``core`` for services.gateway.core.x,
    ``front_door`` for services.gateway.front_door, ``models_api`` for ``from services.gateway import models_api``."""
    parts: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            modules = ([f"{PACKAGE}.{alias.name}" for alias in node.names] if node.module == PACKAGE
                       else [node.module])
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"a relative import (level {node.level}): name the module in full")
        else:
            continue
        parts.update(m.split(".")[2] for m in modules if m.startswith(f"{PACKAGE}."))
    return parts


def part_of(path: pathlib.Path) -> str:
    """``core`` for services/gateway/core/x.py, ``front_door`` for services/gateway/front_door.py."""
    rel = path.relative_to(GATEWAY)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def modules(parts: tuple[str, ...]) -> list[pathlib.Path]:
    return sorted(p for p in GATEWAY.rglob("*.py") if part_of(p) in parts)


def shared_parts() -> tuple[str, ...]:
    top = tuple(p.stem for p in GATEWAY.glob("*.py") if p.stem not in ABOVE)
    return SHARED_PACKAGES + top


def wrong_imports(path: pathlib.Path, source: str) -> set[str]:
    """What ``path`` imports from services/gateway that its layer may not."""
    own = part_of(path)
    imported = gateway_imports(source) - {own}
    if own in FRONT_ENDS:
        return imported - set(shared_parts())
    if own in shared_parts():
        return imported & set(FRONT_ENDS + ABOVE)
    return set()


def test_every_front_end_and_shared_part_is_known():
    """A new folder is a front end or shared, said here; otherwise this test would not look at it."""
    folders = {p.name for p in GATEWAY.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(FRONT_ENDS) | set(SHARED_PACKAGES) | {"http_api", "edge", "extensions"}


@pytest.mark.parametrize("path", modules(FRONT_ENDS), ids=lambda p: str(p.relative_to(GATEWAY)))
def test_a_front_end_imports_only_itself_and_the_shared_layer(path: pathlib.Path):
    assert wrong_imports(path, path.read_text()) == set()


@pytest.mark.parametrize("path", modules(shared_parts()), ids=lambda p: str(p.relative_to(GATEWAY)))
def test_the_shared_layer_imports_no_front_end(path: pathlib.Path):
    assert wrong_imports(path, path.read_text()) == set()


def test_a_front_end_importing_another_is_caught():
    """The check itself: each way of naming another front end (or a module above) is found."""
    kserve = GATEWAY / "kserve" / "request.py"
    for line in ("from services.gateway.openai.server import GatewayServicer",
                 "import services.gateway.videos.jobs",
                 "from services.gateway import anthropic",
                 "def f():\n    from services.gateway.http_api import routes"):
        assert wrong_imports(kserve, line), line
    core = GATEWAY / "core" / "pipeline.py"
    assert wrong_imports(core, "from services.gateway.responses_api.store import ResponseStore")
    assert wrong_imports(kserve, "from services.gateway.media.runner import MediaRunner") == set()
