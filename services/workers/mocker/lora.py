"""The mocker's LoRA adapters: no weights, only what routing at scale needs (docs/lora.md).

An adapter the mocker "loads" must be a PEFT directory (adapter_config.json), as vLLM's loader would
insist, so that a wrong path is refused the same way; a request under an adapter salts its KV blocks
with the adapter's name (services/workers/mocker/sequence.py), so the router's index sees one cache
per adapter, as on a real engine.
"""

from __future__ import annotations

from pathlib import Path

from services.common.discovery import LoraAdapter
from services.common.errors import InvalidRequest

ADAPTER_CONFIG = "adapter_config.json"


class SimulatedLora:
    """``services.workers.lora.LoraEngine`` for the mocker: checks the directory, keeps nothing."""

    async def load_lora(self, adapter: LoraAdapter, lora_id: int) -> None:
        if not (Path(adapter.path) / ADAPTER_CONFIG).is_file():
            raise InvalidRequest(f"The LoRA adapter `{adapter.name}` cannot be loaded: no {ADAPTER_CONFIG} in "
                                 "its directory", param="lora_path")

    async def unload_lora(self, adapter: LoraAdapter, lora_id: int) -> None:
        pass
