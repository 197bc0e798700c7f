"""Warm a model's artifacts when its first worker registers, not on its first request.

The preprocessor (template, tokenizer) and the postprocessor (tokenizer, detokenizer tables) each
warm their own; a model is discovered by every service at about the same time, so by the time a
client can see it in the gateway's /v1/models its path is usually warm (the gateway's own warm-up
request makes sure: services/gateway/warmup.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from services.common.discovery import ModelCard, WorkerCard, WorkerRegistry

Warm = Callable[[ModelCard], Coroutine[Any, Any, None]]
Closer = Callable[[], Coroutine[Any, Any, None]]


def warm_each_new_model(registry: WorkerRegistry, warm: Warm) -> Closer:
    """Runs ``warm`` in the background for each model whose worker registers (once per model name and
    directory); returns a closer that cancels warm-ups still running."""
    warming: set[asyncio.Task] = set()
    warmed: set[tuple[str, str]] = set()

    def on_register(_worker_id: str, card: WorkerCard | None) -> None:
        # A media model (images, videos) has no tokenizer or template here: its requests skip the stages.
        if card is None or card.model.is_media or (card.model.name, card.model.model_dir) in warmed:
            return
        warmed.add((card.model.name, card.model.model_dir))
        task = asyncio.get_running_loop().create_task(warm(card.model))
        warming.add(task)
        task.add_done_callback(warming.discard)

    async def stop_warming() -> None:
        for task in list(warming):
            task.cancel()

    registry.subscribe(on_register)
    return stop_warming
