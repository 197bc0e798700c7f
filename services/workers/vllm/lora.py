"""LoRA on the vLLM worker, with ``vllm serve``'s flags and semantics (docs/lora.md).

- ``--enable-lora``, ``--max-loras``, ``--max-lora-rank``, ``--max-cpu-loras`` are vLLM engine arguments:
  they pass through to ``AsyncEngineArgs`` unchanged. The card's ``max_loras`` is the engine's.
- ``--lora-modules`` is a ``vllm serve`` (front-end) flag, not an engine argument, so the worker reads it
  here, in vLLM's forms: ``name=path`` items, or JSON objects ``{"name": ..., "path": ...}``, several
  after one flag or the flag repeated. It needs ``--enable-lora``, as in vLLM.
- Runtime loading (``/v1/load_lora_adapter``, and a request for an adapter held elsewhere) follows vLLM's
  switch, the ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` environment variable.

Adapters load into the engine with ``AsyncLLM.add_lora`` before the worker registers or answers a load,
and requests run with vLLM's own ``LoRARequest`` (name, the worker's id for it, path). This module imports
vllm only inside the functions that need it: the flag split runs before vllm is imported.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from services.common.discovery import LoraAdapter
from services.common.errors import InvalidRequest
from services.workers.config import ConfigError
from services.workers.lora import RUNTIME_LOADING_ENV, HeldAdapter, LoraSettings, WorkerAdapters, parse_lora_modules
from services.workers.server import EngineStartFailed

FLAG = "--lora-modules"


def split_lora_modules(argv: Sequence[str]) -> tuple[tuple[LoraAdapter, ...], tuple[str, ...]]:
    """``--lora-modules`` items out of the engine flags; returns the adapters and the other flags."""
    items: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == FLAG:
            i += 1
            start = len(items)
            while i < len(argv) and not argv[i].startswith("--"):
                items.append(argv[i])
                i += 1
            if len(items) == start:
                raise ConfigError([f"{FLAG} needs at least one name=path"])
            continue
        if arg.startswith(FLAG + "="):
            items.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    pairs, errors = parse_lora_modules([_as_pair(item) for item in items])
    if errors:
        raise ConfigError(errors)
    return pairs, tuple(rest)


def _as_pair(item: str) -> str:
    """vLLM's JSON form as name=path (its base_model_name is the worker's own model here)."""
    if not item.lstrip().startswith("{"):
        return item
    try:
        module = json.loads(item)
        return f"{module['name']}={module['path']}"
    except (ValueError, KeyError, TypeError):
        return item  # reported by parse_lora_modules as not name=path


def runtime_loading(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """vLLM's switch (its envs module reads the same variable the same way)."""
    return env.get(RUNTIME_LOADING_ENV, "0").strip().lower() in ("1", "true")


def lora_settings(engine_args: Any, modules: tuple[LoraAdapter, ...]) -> LoraSettings:
    """The worker's LoRA settings from vLLM's parsed engine arguments; ConfigError for modules without LoRA."""
    if not engine_args.enable_lora:
        if modules:
            raise ConfigError([f"{FLAG} needs --enable-lora"])
        return LoraSettings()
    return LoraSettings(max_loras=engine_args.max_loras, runtime_loading=runtime_loading(), modules=modules)


def lora_request(held: HeldAdapter | None) -> Any:
    """vLLM's ``LoRARequest`` for a request's adapter (None: the base model)."""
    if held is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(held.adapter.name, held.lora_id, held.adapter.path)


class VllmLora:
    """``services.workers.lora.LoraEngine`` over a started ``AsyncLLM`` (``llm`` returns it)."""

    def __init__(self, llm: Callable[[], Any]):
        self._llm = llm

    async def load_lora(self, adapter: LoraAdapter, lora_id: int) -> None:
        from vllm.lora.request import LoRARequest
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            # Loads the weights now (vLLM's /v1/load_lora_adapter does the same): a bad directory is refused
            # here, with vLLM's reason, not on the first request that names the adapter.
            await self._llm().add_lora(LoRARequest(adapter.name, lora_id, adapter.path))
        except EngineDeadError:
            raise  # the engine's death, which the worker's death watch reports; not the adapter's fault
        except Exception as e:  # the engine core's utility calls fail with a bare Exception
            raise InvalidRequest(f"The LoRA adapter `{adapter.name}` cannot be loaded: {_reason(e)}",
                                 param="lora_path") from e

    async def unload_lora(self, adapter: LoraAdapter, lora_id: int) -> None:
        await self._llm().remove_lora(lora_id)


# The engine core wraps a worker's error: "Call to add_lora method failed: Worker failed with error '<why>',
# please check the stack trace above for the root cause". The client gets <why>.
_WRAPPED = re.compile(r"failed with error '(.*)', please check", re.S)


def _reason(error: BaseException) -> str:
    """vLLM's own words, on one line, bounded."""
    text = str(error)
    wrapped = _WRAPPED.search(text)
    if wrapped is not None:
        text = wrapped.group(1)
    return " ".join(text.split())[:300] or type(error).__name__


async def start_adapters(settings: LoraSettings, engine: Any) -> WorkerAdapters | None:
    """The worker's adapters with ``--lora-modules`` loaded into the started engine (None: LoRA off); a bad
    module stops the worker before it registers, with vLLM's reason."""
    if not settings.enabled:
        return None
    adapters = WorkerAdapters(settings, VllmLora(lambda: engine.llm))
    try:
        await adapters.start()
    except InvalidRequest as e:
        await engine.close()
        raise EngineStartFailed(e.message) from e
    return adapters
