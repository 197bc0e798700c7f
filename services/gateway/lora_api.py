"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter, vLLM's API applied to a fleet (docs/lora.md).

vLLM's server loads an adapter into its one engine; here a load goes to every worker of the base model
that loads adapters at runtime, in parallel, and an unload to every worker holding the adapter. Each
worker puts the change on its card before it answers (services/workers/lora.py); the call returns once
this gateway's discovery view shows it, so a request sent after the answer finds the adapter.

Bodies and answers are vLLM's: ``{"lora_name", "lora_path"}`` and ``{"lora_name"}``, answered with a
text/plain "Success: ..." line. ``base_model_name`` (as in vLLM's ``LoRAModulePath``) picks the base
model when more than one served model has LoRA on. Errors are OpenAI-shaped: a 400 for a bad body or an
adapter a worker refuses, a 404 for unloading an adapter nobody holds.

With ``--auth`` both routes take a key (the front door's check), and a key limited by ``--models`` changes only
adapters (and bases) among its models: any other is the 404 of a model that does not exist (``check``), so one
tenant cannot unload what another serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson

from services.common.discovery import LoraAdapter, WorkerCard, adapter_of
from services.common.errors import InvalidRequest, NotFound

log = logging.getLogger(__name__)
Models = Callable[[], dict[str, list[WorkerCard]]]
# The caller's model check: raises the 404 of an unknown model for one its key may not use (the front door's).
Check = Callable[[str], None]
VISIBLE_TIMEOUT_S = 5.0  # a worker's card reaches this gateway within a NATS round trip; bounded anyway


class LoraWorkers(Protocol):
    async def load(self, address: str, adapter: LoraAdapter) -> bool: ...

    async def unload(self, address: str, name: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class LoadRequest:
    lora_name: str
    lora_path: str
    base_model_name: str = ""


def _body(data: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise InvalidRequest("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body


def _string(body: dict[str, Any], field: str, *, required: bool = True) -> str:
    value = body.get(field)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"`{field}` must be a non-empty string.", param=field)
    return value.strip()


def parse_load(data: bytes) -> LoadRequest:
    body = _body(data)
    unknown = sorted(set(body) - {"lora_name", "lora_path", "base_model_name", "load_inplace"})
    if unknown:
        raise InvalidRequest(f"Unknown field `{unknown[0]}`.", param=unknown[0])
    if body.get("load_inplace"):  # vLLM's in-place reload: not across a fleet (unload, then load)
        raise InvalidRequest("`load_inplace` is not supported: unload the adapter, then load it again.",
                             param="load_inplace")
    return LoadRequest(_string(body, "lora_name"), _string(body, "lora_path"),
                       _string(body, "base_model_name", required=False))


def parse_unload(data: bytes) -> str:
    body = _body(data)
    unknown = sorted(set(body) - {"lora_name", "lora_int_id"})
    if unknown:
        raise InvalidRequest(f"Unknown field `{unknown[0]}`.", param=unknown[0])
    return _string(body, "lora_name")


class LoraAdmin:
    """Loads and unloads adapters across the workers discovery knows."""

    def __init__(self, models: Models, workers: LoraWorkers):
        self._models = models
        self._workers = workers

    def _lora_bases(self) -> dict[str, list[WorkerCard]]:
        """Base models with LoRA on, and their workers that have it on."""
        out: dict[str, list[WorkerCard]] = {}
        for name, cards in self._models().items():
            lora = [c for c in cards if c.model.name == name and c.max_loras > 0]
            if lora:
                out[name] = lora
        return out

    def _base(self, req: LoadRequest) -> str:
        bases = self._lora_bases()
        if req.base_model_name:
            if req.base_model_name not in self._models():
                raise NotFound(f"The model `{req.base_model_name}` does not exist.", param="base_model_name",
                               code="model_not_found")
            if req.base_model_name not in bases:
                raise InvalidRequest(f"The model `{req.base_model_name}` is not served with LoRA enabled.",
                                     param="base_model_name")
            return req.base_model_name
        if not bases:
            raise InvalidRequest("No model is served with LoRA enabled (start its workers with --enable-lora).",
                                 param="lora_name")
        if len(bases) > 1:
            raise InvalidRequest(f"Several models serve LoRA adapters ({', '.join(sorted(bases))}): name one in "
                                 "`base_model_name`.", param="base_model_name")
        return next(iter(bases))

    async def load(self, data: bytes, check: Check = lambda name: None) -> str:
        req = parse_load(data)
        check(req.lora_name)
        if req.base_model_name:
            check(req.base_model_name)
        models = self._models()
        cards = models.get(req.lora_name, [])
        if cards and adapter_of(req.lora_name, cards) is None:
            raise InvalidRequest(f"`{req.lora_name}` is a base model's name.", param="lora_name")
        base = self._base(req)
        check(base)
        if cards and cards[0].model.name != base:
            raise InvalidRequest(f"The LoRA adapter `{req.lora_name}` is already loaded for the model "
                                 f"`{cards[0].model.name}`.", param="lora_name")
        loaders = [c for c in self._lora_bases()[base] if c.lora_runtime_loading]
        if not loaders:
            raise InvalidRequest(f"No worker of `{base}` loads LoRA adapters at runtime (vLLM: "
                                 "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).", param="lora_name")
        held = {c.worker_id for c in cards}
        missing = [c for c in loaders if c.worker_id not in held]
        if not missing:  # vLLM's answer for a second load of the same adapter
            raise InvalidRequest(f"The lora adapter '{req.lora_name}' has already been loaded.", param="lora_name")
        adapter = LoraAdapter(req.lora_name, req.lora_path)
        await self._each(missing, lambda c: self._workers.load(c.address, adapter))
        await self._visible(lambda: {c.worker_id for c in self._models().get(req.lora_name, [])}
                            >= {c.worker_id for c in missing})
        return f"Success: LoRA adapter '{req.lora_name}' added successfully."

    async def unload(self, data: bytes, check: Check = lambda name: None) -> str:
        name = parse_unload(data)
        check(name)
        cards = self._models().get(name, [])
        if adapter_of(name, cards) is None:
            raise NotFound(f"The lora adapter '{name}' cannot be found.", param="lora_name",
                           code="model_not_found")
        await self._each(cards, lambda c: self._workers.unload(c.address, name))
        await self._visible(lambda: adapter_of(name, self._models().get(name, [])) is None)
        return f"Success: LoRA adapter '{name}' removed successfully."

    @staticmethod
    async def _each(cards: Sequence[WorkerCard], call: Callable[[WorkerCard], Any]) -> None:
        """Calls every worker at once; the first failure (in card order) is the answer, after all finished."""
        results = await asyncio.gather(*(call(c) for c in cards), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        for card, result in zip(cards, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("LoRA change on worker %s failed: %s", card.worker_id, result)
        if failures:  # a worker's MeshError keeps its status (a refused path is a 400); others are bugs
            raise failures[0]

    async def _visible(self, done: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + VISIBLE_TIMEOUT_S
        while not done() and loop.time() < deadline:
            await asyncio.sleep(0.02)
