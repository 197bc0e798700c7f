"""The LoRA adapters one worker holds, engine-neutral (docs/lora.md).

A worker with LoRA on (``--enable-lora``; ``max_loras`` > 0 on its card) starts with the adapters its
``--lora-modules name=path`` name and, when it loads adapters at runtime, takes more from
``LoadLoraAdapter`` or from a request whose adapter it does not hold yet (the router sends such a
request here only when no worker holding it could take it). Every change goes out on the worker's card
at once, so the routers route by it.

Engines key an adapter by a positive integer (vLLM's ``lora_int_id``): this module hands them out, one
per name, never reused while the worker lives, so an unloaded and reloaded adapter is a new id and no
cached block of the old weights can be mistaken for the new ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from services.common.discovery import LoraAdapter
from services.common.errors import InvalidRequest, NotFound

log = logging.getLogger(__name__)

# What vLLM's server answers for the environment switch that turns runtime loading on; the worker
# honours the same switch (and the mocker its --lora-runtime-loading flag).
RUNTIME_LOADING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """A worker's LoRA configuration (vLLM's flags' meaning)."""

    max_loras: int = 0  # distinct adapters in one engine step; 0: LoRA off
    runtime_loading: bool = False
    modules: tuple[LoraAdapter, ...] = ()  # --lora-modules, loaded at start

    @property
    def enabled(self) -> bool:
        return self.max_loras > 0


def parse_lora_modules(values: Sequence[str]) -> tuple[tuple[LoraAdapter, ...], list[str]]:
    """``name=path`` items (vLLM's ``--lora-modules`` short form); returns the adapters and the errors."""
    adapters: dict[str, LoraAdapter] = {}
    errors = []
    for item in values:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            errors.append(f"--lora-modules: {item!r} is not name=path")
        elif name in adapters:
            errors.append(f"--lora-modules: {name!r} is given twice")
        else:
            # Absolute: the path goes out on the card, and another worker may load it from there.
            adapters[name] = LoraAdapter(name.strip(), str(Path(path.strip()).resolve()))
    return tuple(adapters.values()), errors


class LoraEngine(Protocol):
    """What an engine that serves LoRA adds to ``services.workers.engine.Engine``."""

    async def load_lora(self, adapter: LoraAdapter, lora_id: int) -> None:
        """Loads the adapter under ``lora_id``; raises ``InvalidRequest`` when the engine refuses it."""

    async def unload_lora(self, adapter: LoraAdapter, lora_id: int) -> None:
        """Frees it."""


@dataclasses.dataclass(frozen=True)
class HeldAdapter:
    adapter: LoraAdapter
    lora_id: int


class WorkerAdapters:
    """The adapters held, by name; ``on_change`` publishes the new list (the worker's card)."""

    def __init__(self, settings: LoraSettings, engine: LoraEngine | None,
                 on_change: Callable[[tuple[LoraAdapter, ...]], Awaitable[None]] | None = None):
        self.settings = settings
        self._engine = engine
        self.on_change = on_change
        self._held: dict[str, HeldAdapter] = {}
        self._next_id = 1
        self._lock = asyncio.Lock()  # one load or unload at a time: ids and the card stay in step

    @property
    def adapters(self) -> tuple[LoraAdapter, ...]:
        return tuple(h.adapter for h in self._held.values())

    async def start(self) -> None:
        """Loads ``--lora-modules`` (before the worker registers: its first card lists them)."""
        for adapter in self.settings.modules:
            await self._load(adapter)

    async def resolve(self, wanted: LoraAdapter) -> HeldAdapter:
        """The held adapter a request names, loading it first when allowed; a 404 otherwise."""
        held = self._held.get(wanted.name)
        if held is not None:
            return held
        if not self.settings.enabled:
            raise NotFound(f"The model `{wanted.name}` does not exist: this worker serves no LoRA adapters.",
                           param="model", code="model_not_found")
        if not self.settings.runtime_loading or not wanted.path:
            raise NotFound(f"The LoRA adapter `{wanted.name}` is not loaded on this worker.", param="model",
                           code="model_not_found")
        await self.load(wanted)
        return self._held[wanted.name]

    async def load(self, adapter: LoraAdapter) -> bool:
        """Loads ``adapter`` (False: held already, under the same path)."""
        if not self.settings.enabled:
            raise InvalidRequest("LoRA is off on this worker (start it with --enable-lora)", param="lora_name")
        async with self._lock:
            held = self._held.get(adapter.name)
            if held is not None:
                if held.adapter.path != adapter.path:
                    raise InvalidRequest(f"The LoRA adapter `{adapter.name}` is already loaded from another path; "
                                         "unload it first", param="lora_name")
                return False
            if not self.settings.runtime_loading:
                raise InvalidRequest("this worker does not load LoRA adapters at runtime (vLLM: set "
                                     f"{RUNTIME_LOADING_ENV}=True)", param="lora_name")
            await self._load(adapter)
        await self._publish()
        return True

    async def unload(self, name: str) -> None:
        async with self._lock:
            held = self._held.get(name)
            if held is None:
                raise NotFound(f"The LoRA adapter `{name}` cannot be found.", param="lora_name",
                               code="model_not_found")
            if self._engine is not None:
                await self._engine.unload_lora(held.adapter, held.lora_id)
            del self._held[name]
        log.info("unloaded LoRA adapter %s", name)
        await self._publish()

    async def _load(self, adapter: LoraAdapter) -> None:
        lora_id, self._next_id = self._next_id, self._next_id + 1
        if self._engine is not None:
            await self._engine.load_lora(adapter, lora_id)
        self._held[adapter.name] = HeldAdapter(adapter, lora_id)
        log.info("loaded LoRA adapter %s from %s", adapter.name, adapter.path)

    async def _publish(self) -> None:
        if self.on_change is not None:
            await self.on_change(self.adapters)
