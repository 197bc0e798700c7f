"""Fixtures every engine environment's tests share (each engine's own setup is in its directory's conftest)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def oracle_model_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The parser oracle tests' tokenizer: the demo model's with every format's markers (parser_oracle.py)."""
    from tests.engine_env.parser_oracle import build_oracle_model

    return build_oracle_model(demo_model_dir, tmp_path_factory.mktemp("oracle-model"))
