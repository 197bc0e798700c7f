"""Builds the demo/test model directory offline, once, and reuses it afterwards.

A build writes tokenizer.json, tokenizer_config.json, chat_template.jinja, config.json,
generation_config.json and, on request, random safetensors weights. A marker file records a hash
of every input (builder version, name, context length, tiktoken ranks, template), so a second call
with the same inputs returns at once; any change rebuilds. An flock around check-and-build makes
concurrent callers (parallel test processes, several services starting) wait for one build.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services.models import qwen

log = logging.getLogger(__name__)

BUILD_VERSION = 2  # 2: head_dim 64 for vLLM's CPU attention
MARKER = ".meshfront-build.json"
DEFAULT_NAME = "meshfront/demo-qwen"
DEFAULT_CONTEXT_LENGTH = 4096
REPO_ROOT = Path(__file__).resolve().parents[2]
WEIGHT_FILES = ("model.safetensors",)


def default_test_model_dir(with_weights: bool = False) -> Path:
    """The shared build used by every test suite: ``<repo>/build/models/demo-qwen``.

    ``MESHFRONT_TEST_MODEL_DIR`` overrides the location (e.g. for a read-only checkout).
    """
    out = Path(os.environ.get("MESHFRONT_TEST_MODEL_DIR") or REPO_ROOT / "build" / "models" / "demo-qwen")
    return build_demo_model(out, with_weights=with_weights)


def build_demo_model(out_dir: str | Path, *, name: str = DEFAULT_NAME, with_weights: bool = False,
                     context_length: int = DEFAULT_CONTEXT_LENGTH) -> Path:
    """Builds (or reuses) a Qwen-vocabulary model directory at ``out_dir`` and returns its path.

    Args:
        out_dir: target directory; created if missing. Files the build owns are overwritten.
        name: recorded as ``_name_or_path`` in config.json.
        with_weights: also save a tiny seeded random Qwen2ForCausalLM (needs torch).
        context_length: config.json ``max_position_embeddings`` and ``model_max_length``.
    """
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    inputs = _inputs_hash(name, context_length)
    if _is_complete(out, inputs, with_weights):
        return out
    with _locked(out.parent / f".{out.name}.lock"):
        if _is_complete(out, inputs, with_weights):  # another process built it while we waited
            return out
        marker = _read_marker(out)
        if marker.get("inputs") != inputs:
            _write_tokenizer_and_configs(out, name, context_length)
            marker = {"inputs": inputs, "with_weights": False}
            _write_json_atomic(out / MARKER, marker)
        if with_weights and not marker.get("with_weights"):
            log.info("saving random weights into %s", out)
            qwen.save_random_weights(out)
            _write_json_atomic(out / MARKER, {"inputs": inputs, "with_weights": True})
    return out


def _inputs_hash(name: str, context_length: int) -> str:
    h = hashlib.sha256()
    for part in (str(BUILD_VERSION), name, str(context_length), qwen.file_sha256(qwen.TIKTOKEN_PATH),
                 qwen.chat_template()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _read_marker(out: Path) -> dict:
    try:
        return json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def _is_complete(out: Path, inputs: str, with_weights: bool) -> bool:
    marker = _read_marker(out)
    if marker.get("inputs") != inputs:
        return False
    if with_weights:
        return bool(marker.get("with_weights")) and all((out / f).exists() for f in WEIGHT_FILES)
    return True


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _write_tokenizer_and_configs(out: Path, name: str, context_length: int) -> None:
    """Writes every non-weight file; stale weights from an older build are removed first."""
    log.info("building model directory %s", out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).unlink(missing_ok=True)
    for stale in WEIGHT_FILES:
        (out / stale).unlink(missing_ok=True)
    template = qwen.chat_template()
    tok = qwen.build_tokenizer()
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    os.replace(tmp, out / "tokenizer.json")
    _write_text_atomic(out / "chat_template.jinja", template)
    _write_json_atomic(out / "tokenizer_config.json", qwen.tokenizer_config(context_length, template))
    _write_json_atomic(out / "config.json", qwen.model_config(name, context_length))
    _write_json_atomic(out / "generation_config.json", qwen.generation_config())
    _write_json_atomic(out / "special_tokens_map.json", {
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
    })


def _write_json_atomic(path: Path, data: dict) -> None:
    _write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; the build is shared between users and services
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_build(out_dir: str | Path) -> None:
    """Deletes a build directory (used by the CLI's ``--clean``)."""
    shutil.rmtree(out_dir, ignore_errors=True)
