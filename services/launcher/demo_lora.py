"""``meshfront run --demo-lora``: every generating worker also serves ``meshfront/demo-qwen-lora``, a random
PEFT adapter of the demo model built in code (services/models/qwen_lora.py, cached under build/models).

With the mocker the adapter is simulated (its KV blocks salted apart from the base model's); with
``--worker-kind vllm`` vLLM's CPU build loads the real weights. Either way the workers load more
adapters at runtime (/v1/load_lora_adapter; docs/lora.md).
"""

from __future__ import annotations

import os

from services.launcher.plan import ROOT

# Adapters one worker runs at once (vLLM's --max-loras): the demo adapter and a few loaded at runtime.
DEMO_MAX_LORAS = 4


def check_demo_lora(worker_kind: str, model_dir_given: bool) -> None:
    """Raises ValueError for a shape the demo adapter cannot serve."""
    if model_dir_given:
        raise ValueError("--demo-lora serves an adapter of the demo model: drop --model-dir and --model")
    if worker_kind not in ("mocker", "vllm"):
        raise ValueError("--demo-lora needs --worker-kind mocker or vllm")


def demo_lora_flags(worker_kind: str) -> tuple[str, ...]:
    """The worker flags that serve the demo adapter (built now, or reused from build/models)."""
    from services.models.qwen_lora import DEMO_ADAPTER_NAME, RANK, build_demo_adapter

    path = build_demo_adapter(ROOT / "build" / "models" / "demo-qwen-lora")
    flags = ("--enable-lora", "--max-loras", str(DEMO_MAX_LORAS), "--lora-modules", f"{DEMO_ADAPTER_NAME}={path}")
    if worker_kind == "mocker":
        return (*flags, "--lora-runtime-loading")
    # vLLM's switch for /v1/load_lora_adapter; the workers inherit the launcher's environment.
    os.environ.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    return (*flags, "--max-lora-rank", str(RANK))
