"""/openapi.json: valid OpenAPI 3, a route for every route Envoy's transcoder serves, request schemas
that list exactly the fields the parsers accept.

The served routes come from deploy/envoy/gateway.pb (the descriptor Envoy loads) and the transcoder's
``services`` in deploy/envoy/envoy.yaml: an RPC with an http annotation and no entry in
services/gateway/http_api/routes.py fails here, which keeps routes.py the one source of the spec.
"""

from __future__ import annotations

import re

import orjson
import pytest
import yaml
from google.api import annotations_pb2, http_pb2
from google.protobuf import descriptor_pb2

from services.common.errors import InvalidRequest
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.http_api import openai_schemas
from services.gateway.http_api.openapi import document, document_bytes
from services.gateway.http_api.routes import ENDPOINTS
from services.launcher.envoy_config import DESCRIPTOR, ENVOY_YAML
from tests.conftest import require_module

pytestmark = pytest.mark.unit

HTTP_METHODS = ("get", "post", "put", "delete", "patch")


def transcoded_services() -> list[str]:
    cfg = yaml.safe_load(ENVOY_YAML.read_text())
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (transcoder,) = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.grpc_json_transcoder"]
    return transcoder["typed_config"]["services"]


def served_routes() -> set[tuple[str, str]]:
    """(method, OpenAPI path) of every http annotation of every transcoded service in gateway.pb."""
    fds = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR.read_bytes())
    wanted = set(transcoded_services())
    routes: set[tuple[str, str]] = set()
    found: set[str] = set()
    for f in fds.file:
        for service in f.service:
            name = f"{f.package}.{service.name}"
            if name not in wanted:
                continue
            found.add(name)
            for method in service.method:
                rule: http_pb2.HttpRule = method.options.Extensions[annotations_pb2.http]
                bindings = [rule, *rule.additional_bindings]
                for b in bindings:
                    verb = b.WhichOneof("pattern")
                    assert verb in HTTP_METHODS, f"{name}.{method.name} has no HTTP binding"
                    # /v1/models/{model_id=**} -> /v1/models/{model_id}
                    routes.add((verb, re.sub(r"\{(\w+)=[^}]*\}", r"{\1}", getattr(b, verb))))
    assert found == wanted, f"services in envoy.yaml missing from gateway.pb: {wanted - found}"
    return routes


def spec_routes() -> set[tuple[str, str]]:
    return {(m, path) for path, ops in document()["paths"].items() for m in ops}


def test_document_is_valid_openapi_3():
    validator = require_module("openapi_spec_validator")
    doc = orjson.loads(document_bytes())
    validator.validate(doc)
    assert doc["openapi"].startswith("3.")


def test_every_served_route_is_in_the_spec():
    served = served_routes()
    assert {("post", "/v1/chat/completions"), ("get", "/metrics"), ("get", "/docs")} <= served  # the parse works
    missing = served - spec_routes()
    assert not missing, f"served by Envoy but not in services/gateway/http_api/routes.py: {sorted(missing)}"


def test_the_spec_lists_nothing_unserved():
    extra = spec_routes() - served_routes()
    assert not extra, f"in the spec but not served: {sorted(extra)}"


def test_a_served_route_without_an_entry_is_caught(monkeypatch):
    """What keeps the spec honest: drop one entry and the served routes are no longer covered."""
    from services.gateway.http_api import routes as routes_module

    monkeypatch.setattr(routes_module, "ENDPOINTS", tuple(e for e in ENDPOINTS if e.path != "/v1/completions"))
    monkeypatch.setattr("services.gateway.http_api.openapi.ENDPOINTS", routes_module.ENDPOINTS)
    assert ("post", "/v1/completions") in served_routes() - spec_routes()


def test_every_reference_resolves():
    doc = document()
    names = set(doc["components"]["schemas"])
    refs = set(re.findall(r'"#/components/schemas/(\w+)"', orjson.dumps(doc).decode()))
    assert refs <= names, refs - names
    assert len({e.operation_id for e in ENDPOINTS}) == len(ENDPOINTS)


# Field names clients send to OpenAI-compatible servers (OpenAI's, vLLM's and Dynamo's extensions):
# each is accepted by the parser exactly when the request schema lists it.
CANDIDATE_FIELDS = (
    "messages", "prompt", "model", "store", "reasoning_effort", "metadata", "frequency_penalty", "logit_bias",
    "logprobs", "top_logprobs", "max_tokens", "max_completion_tokens", "n", "modalities", "prediction", "audio",
    "presence_penalty", "response_format", "seed", "service_tier", "stop", "stream", "stream_options",
    "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "user", "web_search_options",
    "mm_processor_kwargs", "ignore_eos", "min_tokens", "top_k", "min_p", "repetition_penalty",
    "include_stop_str_in_output", "guided_json", "guided_regex", "guided_grammar", "guided_choice",
    "guided_decoding_backend", "guided_whitespace_pattern", "skip_special_tokens", "nvext", "chat_template_args",
    "chat_template_kwargs", "media_io_kwargs", "structured_outputs", "echo", "best_of", "suffix", "prompt_logprobs",
    "truncate_prompt_tokens", "add_special_tokens", "documents", "priority",
)
BASES = {"chat": (parse_chat, {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                  openai_schemas.CHAT_REQUEST),
         "completions": (parse_completion, {"model": "m", "prompt": "hi"}, openai_schemas.COMPLETION_REQUEST)}


def _unsupported(parse, body: dict, field: str) -> bool:
    """Whether the parser refuses ``field`` as an unknown one (null: the field's presence alone)."""
    try:
        parse(orjson.dumps({**body, field: None}))
    except InvalidRequest as e:
        return e.message.startswith("Unsupported parameter") and e.param == field
    return False


@pytest.mark.parametrize("endpoint", sorted(BASES))
def test_request_schema_lists_exactly_the_accepted_fields(endpoint):
    parse, body, schema = BASES[endpoint]
    listed = set(schema["properties"])
    wrongly_refused = sorted(f for f in listed if f not in body and _unsupported(parse, body, f))
    assert not wrongly_refused, f"listed in the {endpoint} schema but refused as unknown: {wrongly_refused}"
    unlisted = sorted(f for f in CANDIDATE_FIELDS
                      if f not in listed and not _unsupported(parse, body, f))
    assert not unlisted, f"accepted by the {endpoint} parser but missing from its schema: {unlisted}"
    assert set(schema["required"]) <= listed and not schema["additionalProperties"]


def envoy_http_routes() -> list[dict]:
    cfg = yaml.safe_load(ENVOY_YAML.read_text())
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (vhost,) = hcm["route_config"]["virtual_hosts"]
    return [r["match"] for r in vhost["routes"] if "grpc" not in r["match"]]


def test_every_spec_route_reaches_the_gateway_through_envoy():
    """A route the transcoder knows but no Envoy route sends to the gateway would be a 404 at the edge."""
    matches = envoy_http_routes()
    for method, path in spec_routes():
        concrete = re.sub(r"\{\w+\}", "x", path)
        assert any(m.get("path") == concrete or concrete.startswith(m.get("prefix", "\0")) for m in matches), \
            f"{method.upper()} {path}: no route in deploy/envoy/envoy.yaml"


def test_the_messages_api_is_listed_only_when_it_is_served():
    # --no-enable-anthropic-api (meshfront frontend's default, as Dynamo's): /v1/messages answers 404, so the
    # document must not offer it.
    paths = set(document(anthropic_api=False)["paths"])
    assert "/v1/chat/completions" in paths and not {p for p in paths if p.startswith("/v1/messages")}
    assert "/v1/messages" in document()["paths"]
