"""A random LoRA adapter of the demo model in PEFT's on-disk format, built in code (no ``peft`` needed).

PEFT saves an adapter as ``adapter_config.json`` (rank, alpha, target modules) and
``adapter_model.safetensors`` whose tensors are named
``base_model.model.<module path>.lora_A.weight`` (``[r, in]``) and ``...lora_B.weight`` (``[out, r]``).
vLLM's LoRA loader reads exactly that, so this directory serves ``--lora-modules`` and
``/v1/load_lora_adapter`` like a trained one. PEFT initialises ``lora_B`` to zeros (an untrained adapter
changes nothing); ours is random on both sides and scaled up, so greedy output visibly differs from
the base model's, which the engine tests rely on.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from services.models import qwen

DEMO_ADAPTER_NAME = "meshfront/demo-qwen-lora"
RANK = 8
ALPHA = 16
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
BUILD_VERSION = 2  # 2: INIT_STD 0.1 (0.5 made near-ties that flipped between engine configurations)
INIT_STD = 0.1


def adapter_config(base_model: str) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": list(TARGET_MODULES),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
    }


def _shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target projection of the demo Qwen2."""
    hidden = config["hidden_size"]
    head = hidden // config["num_attention_heads"]
    kv = head * config["num_key_value_heads"]
    return {"q_proj": (hidden, hidden), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (hidden, hidden)}


def random_adapter_tensors(seed: int = 1) -> dict:
    import torch

    config = qwen.model_config("meshfront/demo-qwen", 4096)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (fan_in, fan_out) in _shapes(config).items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            # The update (alpha/r) B A is a few times the base weights (std 0.02): the greedy tokens move, while
            # activations stay small enough that two engine configurations agree on them to the last token.
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, fan_in, generator=gen) * INIT_STD
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, RANK, generator=gen) * INIT_STD
    return tensors


def _inputs_hash(base_model: str, seed: int) -> str:
    return hashlib.sha256(f"{BUILD_VERSION}\0{base_model}\0{seed}".encode()).hexdigest()


def build_demo_adapter(out_dir: str | Path, *, base_model: str = "meshfront/demo-qwen", seed: int = 1) -> Path:
    """Writes (or reuses) the adapter directory at ``out_dir`` and returns its path (needs torch)."""
    from safetensors.torch import save_file

    from services.models.build import _locked, _write_json_atomic

    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp = out / ".meshfront-build.json"
    inputs = _inputs_hash(base_model, seed)

    def complete() -> bool:
        try:
            return json.loads(stamp.read_text()).get("inputs") == inputs and (out / WEIGHTS_FILE).exists()
        except (OSError, ValueError):
            return False

    if complete():
        return out
    with _locked(out.parent / f".{out.name}.lock"):
        if complete():
            return out
        out.mkdir(parents=True, exist_ok=True)
        stamp.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out, prefix=".adapter.")
        os.close(fd)
        save_file(random_adapter_tensors(seed), tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / WEIGHTS_FILE)
        _write_json_atomic(out / CONFIG_FILE, adapter_config(base_model))
        _write_json_atomic(stamp, {"inputs": inputs})
    return out


def default_demo_adapter_dir() -> Path:
    """``<repo>/build/models/demo-qwen-lora``, next to the demo model."""
    from services.models.build import REPO_ROOT

    return build_demo_adapter(REPO_ROOT / "build" / "models" / "demo-qwen-lora")
