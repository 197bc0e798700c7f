"""The oracle job (``make test-oracle``): the engines' parsers as oracles for ours.

Not part of the default run (``--ignore=tests/oracle`` in pyproject's addopts): it needs vLLM (and
SGLang) installed, in their own virtual environments (docs/parsers.md). Run explicitly, a missing
engine fails the run; it is never skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.oracle.streams import build_oracle_model


@pytest.fixture(scope="session")
def oracle_model_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_oracle_model(demo_model_dir, tmp_path_factory.mktemp("oracle-model"))


def require_engine(name: str) -> None:
    """Fails (never skips) when the engine under test is missing: this job exists to run it."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        pytest.fail(f"the oracle tests need {name}; run them with `make test-oracle` (docs/parsers.md)",
                    pytrace=False)
