"""/v1/models, /health and /live bodies, from the discovery mirror (and, for /health, the stage watch).

As in Dynamo, the models routes content-negotiate: the ``anthropic`` SDK sends ``anthropic-version`` on
every call, OpenAI clients never do, so one route serves both SDKs' ``models.list()`` and
``models.retrieve()`` (``anthropic_*`` below: Anthropic's shape; one page, ``has_more`` false: a mesh
serves a handful of models).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from services.common.discovery import IMAGES, VIDEOS, WorkerCard, adapter_of
from services.common.errors import MeshError

# The header the anthropic SDK sends on every request: the models routes answer in Anthropic's shape.
ANTHROPIC_VERSION_HEADER = "anthropic-version"


def _model_entry(name: str, cards: list[WorkerCard], created: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": name, "object": "model", "created": created, "owned_by": "meshfront"}
    if adapter_of(name, cards) is not None:
        # A LoRA adapter names its base model as vLLM's list does (parent), and as its root: the base is
        # what it was trained from (its directory stays on the workers' cards, not in a response).
        entry["parent"] = entry["root"] = cards[0].model.name
    context = max(c.model.context_length for c in cards)
    if context:
        entry["context_window"] = context
    # A media model says which kind it makes (a client cannot chat with it): "images" or "videos".
    kind = next((k for k in (IMAGES, VIDEOS) if cards[0].model.serves(k)), None)
    if kind is not None:
        entry["kind"] = kind
    return entry


def list_models(models: dict[str, list[WorkerCard]]) -> dict[str, Any]:
    now = int(time.time())
    return {"object": "list", "data": [_model_entry(name, cards, now) for name, cards in sorted(models.items())]}


def get_model(models: dict[str, list[WorkerCard]], name: str) -> dict[str, Any] | None:
    cards = models.get(name)
    return _model_entry(name, cards, int(time.time())) if cards else None


def _anthropic_entry(name: str, cards: list[WorkerCard], now: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "model", "id": name, "display_name": name,
                             "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "lifecycle": "active"}
    context = max(c.model.context_length for c in cards)
    if context:
        entry["max_input_tokens"] = context
    return entry


def anthropic_list_models(models: dict[str, list[WorkerCard]]) -> dict[str, Any]:
    now = time.time()
    data = [_anthropic_entry(name, cards, now) for name, cards in sorted(models.items())]
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def anthropic_get_model(models: dict[str, list[WorkerCard]], name: str) -> dict[str, Any] | None:
    cards = models.get(name)
    return _anthropic_entry(name, cards, time.time()) if cards else None


def anthropic_not_found(name: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "not_found_error", "message": f"model: {name} does not exist"}}


# Anthropic's error types for what the models routes answer before their body (--auth): a missing or unknown key,
# a key store out of reach (the Messages API's own table is anthropic/errors.py, a front end this layer cannot use).
_ANTHROPIC_TYPES = {401: "authentication_error", 404: "not_found_error"}


def anthropic_error_body(err: MeshError) -> bytes:
    kind = _ANTHROPIC_TYPES.get(err.http_status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": err.message}})


def health(models: dict[str, list[WorkerCard]], warming: Sequence[str] = (),
           unavailable: Sequence[str] = ()) -> tuple[bool, dict[str, Any]]:
    """Ready when at least one model has a live worker, the models known at start are warm and every
    stage is reachable (``unavailable``: stages by name, never by address)."""
    ready = bool(models) and not warming and not unavailable
    status = "healthy" if ready else "unavailable" if unavailable else "warming" if warming else "unhealthy"
    body: dict[str, Any] = {"status": status, "models": {name: len(cards) for name, cards in sorted(models.items())}}
    if warming:
        body["warming"] = list(warming)
    if unavailable:
        body["unavailable"] = list(unavailable)
        names = " and ".join(f"the {stage}" for stage in unavailable)
        body["message"] = f"{names} {'is' if len(unavailable) == 1 else 'are'} unavailable"
    return ready, body
