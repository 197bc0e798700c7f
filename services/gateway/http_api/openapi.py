"""Builds the OpenAPI 3.0 document (/openapi.json) from routes.ENDPOINTS and the schema modules."""

from __future__ import annotations

import functools
import http
from typing import Any

import orjson

from services.gateway.http_api import anthropic_schemas, batch_schemas, image_schemas, openai_schemas, videos_schemas
from services.gateway.http_api.routes import ANTHROPIC, ENDPOINTS, JSON, Endpoint
from services.gateway.http_api.schema import Schema

VERSION = "0.1.0"
TITLE = "Meshfront"
TAGS = ({"name": "OpenAI", "description": "OpenAI-compatible generation and model listing"},
        {"name": "Anthropic", "description": "Anthropic Messages API"},
        {"name": "Service", "description": "Readiness, liveness, metrics and these documents"})


def schemas() -> dict[str, Schema]:
    """Every named schema; a name defined twice is a mistake, not an override."""
    out: dict[str, Schema] = {}
    for module in (openai_schemas, anthropic_schemas, image_schemas, videos_schemas, batch_schemas):
        clash = out.keys() & module.SCHEMAS.keys()
        if clash:
            raise ValueError(f"schema names defined twice: {sorted(clash)}")
        out.update(module.SCHEMAS)
    return out


def _operation(e: Endpoint) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": e.operation_id, "summary": e.summary, "tags": [e.tag]}
    if e.description:
        op["description"] = e.description
    params = [{"name": name, "in": "path", "required": True, "description": doc, "schema": {"type": "string"}}
              for name, doc in e.path_params]
    params += [{"name": name, "in": "query", "required": False, "description": doc, "schema": {"type": "string"}}
               for name, doc in e.query_params]
    if params:
        op["parameters"] = params
    if e.request is not None:
        op["requestBody"] = {"required": True, "content": {e.request_type: {"schema": e.request}}}
    responses: dict[str, Any] = {"200": {"description": "OK",
                                         "content": {b.content_type: {"schema": b.schema} for b in e.ok}}}
    for status in e.errors:
        phrase = "Client Closed Request" if status == 499 else http.HTTPStatus(status).phrase
        responses[str(status)] = {"description": phrase, "content": {JSON: {"schema": {
            "$ref": f"#/components/schemas/{e.error_schema}"}}}}
    op["responses"] = responses
    return op


def document(anthropic_api: bool = True) -> dict[str, Any]:
    """The OpenAPI document of the routes this gateway serves (the Messages API only when it is on:
    ``--enable-anthropic-api``)."""
    paths: dict[str, dict[str, Any]] = {}
    for e in ENDPOINTS:
        if e.tag == ANTHROPIC and not anthropic_api:
            continue
        methods = paths.setdefault(e.path, {})
        if e.method in methods:
            raise ValueError(f"{e.method.upper()} {e.path} is listed twice")
        methods[e.method] = _operation(e)
    return {
        "openapi": "3.0.3",
        "info": {"title": TITLE, "version": VERSION,
                 "description": "LLM inference frontend: OpenAI- and Anthropic-compatible HTTP API. "
                                "Unknown request fields are a 400 naming them."},
        "tags": list(TAGS),
        "paths": paths,
        "components": {"schemas": schemas()},
    }


@functools.cache
def document_bytes(anthropic_api: bool = True) -> bytes:
    """The document as served (built once per process: it only changes with the code and the flag)."""
    return orjson.dumps(document(anthropic_api), option=orjson.OPT_INDENT_2)
