"""/v1/models, /health and /live bodies, from the discovery mirror."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from services.common.discovery import WorkerCard


def _model_entry(name: str, cards: list[WorkerCard], created: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": name, "object": "model", "created": created, "owned_by": "meshfront"}
    context = max(c.model.context_length for c in cards)
    if context:
        entry["context_window"] = context
    return entry


def list_models(models: dict[str, list[WorkerCard]]) -> dict[str, Any]:
    now = int(time.time())
    return {"object": "list", "data": [_model_entry(name, cards, now) for name, cards in sorted(models.items())]}


def get_model(models: dict[str, list[WorkerCard]], name: str) -> dict[str, Any] | None:
    cards = models.get(name)
    return _model_entry(name, cards, int(time.time())) if cards else None


def health(models: dict[str, list[WorkerCard]], warming: Sequence[str] = ()) -> tuple[bool, dict[str, Any]]:
    """Ready when at least one model has a live worker and the models known at start are warm."""
    ready = bool(models) and not warming
    body: dict[str, Any] = {"status": "healthy" if ready else "warming" if warming else "unhealthy",
                            "models": {name: len(cards) for name, cards in sorted(models.items())}}
    if warming:
        body["warming"] = list(warming)
    return ready, body
