"""Fixtures for the postprocessor core tests: the real demo Qwen tokenizer (built offline once)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer


@pytest.fixture(scope="session")
def tokenizer(demo_model_dir) -> Tokenizer:
    return Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))
