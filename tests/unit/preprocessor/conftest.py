"""Fixtures for the preprocessor's pure-logic tests: the shared demo model and derived variants."""

from __future__ import annotations

import json
import pathlib

import pytest

from services.preprocessor.core.artifacts import ArtifactCache, ModelArtifacts, load_artifacts


@pytest.fixture(scope="session")
def artifacts(demo_model_dir: pathlib.Path) -> ModelArtifacts:
    return ArtifactCache().get(str(demo_model_dir))


@pytest.fixture(scope="session")
def hf_tokenizer(demo_model_dir: pathlib.Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(demo_model_dir))


@pytest.fixture
def variant_dir(tmp_path: pathlib.Path, demo_model_dir: pathlib.Path):
    """Makes a model dir sharing the demo tokenizer with other template/config files."""

    def make(files: dict[str, str | dict]) -> pathlib.Path:
        (tmp_path / "tokenizer.json").symlink_to(demo_model_dir / "tokenizer.json")
        for name, content in files.items():
            text = content if isinstance(content, str) else json.dumps(content)
            (tmp_path / name).write_text(text, encoding="utf-8")
        return tmp_path

    return make


@pytest.fixture
def load_variant(variant_dir):
    def load(files: dict[str, str | dict]) -> ModelArtifacts:
        return load_artifacts(str(variant_dir(files)))

    return load
