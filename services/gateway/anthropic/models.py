"""``GET /v1/models`` in Anthropic's shape, for requests that carry ``anthropic-version``.

As in Dynamo, the models routes content-negotiate: the ``anthropic`` SDK sends that header on
every call, OpenAI clients never do, so one route serves both SDKs' ``models.list()`` and
``models.retrieve()``. The list is one page (``has_more`` false): a mesh serves a handful of models.
"""

from __future__ import annotations

import time
from typing import Any

from services.common.discovery import WorkerCard

# The header the anthropic SDK sends on every request.
VERSION_HEADER = "anthropic-version"


def _created_at(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


def _entry(name: str, cards: list[WorkerCard], now: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "model", "id": name, "display_name": name, "created_at": _created_at(now),
                             "lifecycle": "active"}
    context = max(c.model.context_length for c in cards)
    if context:
        entry["max_input_tokens"] = context
    return entry


def list_models(models: dict[str, list[WorkerCard]]) -> dict[str, Any]:
    now = time.time()
    data = [_entry(name, cards, now) for name, cards in sorted(models.items())]
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def get_model(models: dict[str, list[WorkerCard]], name: str) -> dict[str, Any] | None:
    cards = models.get(name)
    return _entry(name, cards, time.time()) if cards else None


def not_found(name: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "not_found_error", "message": f"model: {name} does not exist"}}
