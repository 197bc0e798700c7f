"""The chat engine factory: Python code that gives each chat model its hooks when the model appears.

Dynamo's frontend calls ``chat_engine_factory(instance_id, card, routed_engine)`` when discovery shows a model and
serves that model's chat requests through the engine it returns (its vLLM or SGLang pre- and post-processing).
Meshfront's factory is narrower: ``factory(model: ModelInfo) -> ChatHooks | None`` (a plain or a coroutine
function), called when a chat model appears among the live workers (again after it left and came back), whose
``ChatHooks`` (core/extension_hooks.py) wrap that model's /v1/chat/completions requests. None: the model is
served as it would be without a factory.

A factory that raises for a model fails that model's chat requests with a 500 (logged once with its traceback)
rather than serving them without the hooks it meant to apply.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Callable
from typing import Any

from services.common.discovery import CHAT, ModelCard, WorkerCard
from services.common.errors import Internal
from services.gateway.core.extension_hooks import ChatHooks

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a factory learns of a model (from its workers' registration)."""

    name: str
    context_length: int
    endpoints: tuple[str, ...]
    input_modalities: tuple[str, ...]

    @classmethod
    def of(cls, name: str, card: ModelCard) -> ModelInfo:
        return cls(name, card.context_length, card.endpoints, card.input_modalities)


class _Failed:
    """The factory raised for this model (logged when it did)."""


class ChatEngines:
    """Each chat model's hooks, made by ``factory`` when the model appears and dropped when it leaves.

    ``on_change`` is the worker registry's listener; ``hooks_for`` is the openai front end's lookup
    (``HookLookup``), awaited once per chat request.
    """

    def __init__(self, factory: Callable[[ModelInfo], Any], models: Callable[[], dict[str, list[WorkerCard]]]):
        self._factory = factory
        self._models = models
        self._made: dict[str, asyncio.Future[ChatHooks | None | _Failed]] = {}

    def on_change(self, worker_id: str, card: WorkerCard | None) -> None:
        present = self._models()
        for name in [n for n in self._made if n not in present]:
            del self._made[name]  # left: a later return is a new appearance
        for name, cards in present.items():
            if name not in self._made and cards[0].model.serves(CHAT):
                self._made[name] = asyncio.ensure_future(self._make(name, cards[0].model))

    async def _make(self, name: str, card: ModelCard) -> ChatHooks | None | _Failed:
        try:
            made = self._factory(ModelInfo.of(name, card))
            if inspect.isawaitable(made):
                made = await made
            if made is not None and not isinstance(made, ChatHooks):
                raise TypeError(f"the factory returned {type(made).__name__}; expected ChatHooks or None")
        except Exception:  # extension code: logged once, its model's requests fail with a 500
            log.exception("the chat engine factory failed for model %s; its chat requests fail until it reappears",
                          name)
            return _Failed()
        log.info("chat engine factory: model %s %s", name, "has hooks" if made is not None else "has none")
        return made

    async def hooks_for(self, model: str) -> ChatHooks | None:
        made = self._made.get(model)
        if made is None:
            cards = self._models().get(model)
            if not cards or not cards[0].model.serves(CHAT):
                return None  # unknown or not a chat model: the model check answers the request
            made = self._made[model] = asyncio.ensure_future(self._make(model, cards[0].model))
        hooks = await asyncio.shield(made)
        if isinstance(hooks, _Failed):
            raise Internal(f"the chat engine factory failed for model `{model}`")
        return hooks
