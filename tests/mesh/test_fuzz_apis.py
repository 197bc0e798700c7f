"""Request fuzzing of the migration APIs through Envoy: Anthropic Messages, Responses and Embeddings.

Hypothesis builds bodies from each API's own field names, with values of every JSON type and the whole
JSON number range (tests/mesh/test_fuzz.py's strategies), plus bodies that are not JSON at all, and
sends them as HTTP through Envoy to a mesh that serves a chat model and an embedding model. A request
passes when the answer is a success or a 4xx in the error shape of its own API (Anthropic's
``{"type": "error", "error": {...}}`` for /v1/messages, OpenAI's for the others): never a 5xx and
never a gateway that stopped answering.
"""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest

from services.launcher.plan import WorkerSpec
from services.models.minilm import default_embedding_model_dir
from tests.conftest import require_module, stop_cleanly
from tests.mesh.conftest import DEMO, DEMO_PARSERS, mocker, start_mesh
from tests.mesh.test_fuzz import _openai_error_problem, json_values, numbers, wild

pytestmark = pytest.mark.mesh

hypothesis = require_module("hypothesis")
st = hypothesis.strategies

EMBED = "sentence-transformers/all-MiniLM-L6-v2"
BATCH = 40
BATCHES = 30  # 1,200 bodies over the four endpoints
MODELS = st.sampled_from([DEMO, EMBED, "no-such-model", ""])
TEXT = st.text(max_size=30)


@pytest.fixture(scope="module")
def api_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS),
                                      WorkerSpec(str(default_embedding_model_dir()), EMBED, "embed")])
    yield m
    stop_cleanly(m)


def _maybe(value):
    """A field's plausible value, or anything at all."""
    return st.one_of(value, value, wild)


_blocks = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": TEXT, "name": TEXT, "input": json_values}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": TEXT, "content": _maybe(TEXT)}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": TEXT, "signature": TEXT}),
    json_values), max_size=3)
_anthropic_messages = st.lists(st.fixed_dictionaries({
    "role": st.one_of(st.sampled_from(["user", "assistant"]), wild),
    "content": st.one_of(TEXT, _blocks, wild)}), max_size=3)
_anthropic_tool = st.fixed_dictionaries({"name": TEXT, "description": TEXT,
                                         "input_schema": st.one_of(st.just({"type": "object"}), json_values)})
MESSAGES = {
    "model": MODELS, "max_tokens": _maybe(st.integers(1, 8)) | numbers, "messages": _anthropic_messages,
    "system": st.one_of(TEXT, _blocks), "stream": _maybe(st.booleans()), "temperature": numbers,
    "top_p": numbers, "top_k": numbers, "stop_sequences": _maybe(st.lists(TEXT, max_size=3)),
    "tools": _maybe(st.lists(_anthropic_tool, max_size=2)),
    "tool_choice": _maybe(st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none"]),
                                                 "name": TEXT})),
    "thinking": _maybe(st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled"]),
                                              "budget_tokens": numbers})),
    "metadata": wild, "bogus_field": wild,
}
_response_items = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer"]),
                           "content": st.one_of(TEXT, st.lists(st.fixed_dictionaries(
                               {"type": st.sampled_from(["input_text", "output_text", "input_image"]),
                                "text": TEXT}), max_size=2))}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": TEXT, "name": TEXT, "arguments": TEXT}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": TEXT, "output": TEXT}),
    json_values), max_size=3)
RESPONSES = {
    "model": MODELS, "input": st.one_of(TEXT, _response_items, wild), "instructions": _maybe(TEXT),
    "max_output_tokens": _maybe(st.integers(1, 8)) | numbers, "temperature": numbers, "top_p": numbers,
    "stream": _maybe(st.booleans()), "store": _maybe(st.booleans()),
    "previous_response_id": _maybe(TEXT), "tools": wild, "tool_choice": wild, "parallel_tool_calls": wild,
    "text": _maybe(st.fixed_dictionaries({"format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema"]), "schema": json_values, "name": TEXT})})),
    "reasoning": _maybe(st.fixed_dictionaries({"effort": st.sampled_from(["low", "medium", "high", "none"])})),
    "background": wild, "metadata": wild, "bogus_field": wild,
}
EMBEDDINGS = {
    "model": MODELS,
    "input": st.one_of(TEXT, st.lists(TEXT, max_size=4), st.lists(numbers, max_size=4),
                       st.lists(st.lists(st.integers(-5, 40_000), max_size=5), max_size=3), wild),
    "encoding_format": _maybe(st.sampled_from(["float", "base64"])), "dimensions": numbers, "user": wild,
    "bogus_field": wild,
}
ENDPOINTS = {"/v1/messages": MESSAGES, "/v1/messages/count_tokens": MESSAGES, "/v1/responses": RESPONSES,
             "/v1/embeddings": EMBEDDINGS}


def _body(fields: dict) -> st.SearchStrategy:
    """Bodies with a random subset of ``fields`` (the required ones usually there), sometimes not JSON."""
    keys = sorted(fields)
    chosen = st.lists(st.sampled_from(keys), unique=True, max_size=len(keys))
    objects = chosen.flatmap(lambda ks: st.fixed_dictionaries({k: fields[k] for k in ks}))
    with_model = st.fixed_dictionaries({k: fields[k] for k in ("model",)}).flatmap(
        lambda base: objects.map(lambda o: {**base, **o}))
    raw = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"{", b"[]", b"null", b'{"model": 1}']))
    return st.one_of(with_model.map(lambda o: json.dumps(o).encode()), with_model.map(lambda o: json.dumps(o).encode()),
                     objects.map(lambda o: json.dumps(o).encode()), raw)


cases = st.sampled_from(sorted(ENDPOINTS)).flatmap(lambda path: st.tuples(st.just(path), _body(ENDPOINTS[path])))


def _anthropic_error_problem(body: str) -> str | None:
    try:
        doc = json.loads(body)
        err = doc["error"]
    except (ValueError, KeyError, TypeError):
        return "not an Anthropic error body"
    if doc.get("type") != "error" or not (isinstance(err, dict) and isinstance(err.get("type"), str)
                                          and isinstance(err.get("message"), str) and err["message"]):
        return "an incomplete Anthropic error"
    return None


def _post(http: httpx.Client, path: str, data: bytes) -> str | None:
    """Sends one body and reads the whole answer; a description of what is wrong with it, or None."""
    with http.stream("POST", path, content=data, headers={"content-type": "application/json"}) as r:
        text = r.read().decode(errors="replace")
    if r.status_code >= 500:
        return f"{path} {r.status_code} {text[:200]} for {data[:300]!r}"
    if r.status_code >= 400:
        problem = (_anthropic_error_problem if path.startswith("/v1/messages") else _openai_error_problem)(text)
        if problem:
            return f"{path} {r.status_code} {problem}: {text[:200]} for {data[:300]!r}"
    return None


def test_generated_bodies_get_their_own_apis_errors_and_never_a_server_error(api_mesh):
    http = httpx.Client(base_url=api_mesh.url, timeout=60)
    pool = concurrent.futures.ThreadPoolExecutor(8)
    failures: list[str] = []
    sent = dict.fromkeys(ENDPOINTS, 0)

    @hypothesis.settings(max_examples=BATCHES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.lists(cases, min_size=BATCH, max_size=BATCH))
    def batch(bodies):
        failures.extend(f for f in pool.map(lambda c: _post(http, *c), bodies) if f)
        for path, _ in bodies:
            sent[path] += 1

    try:
        batch()
    finally:
        pool.shutdown()
    assert not failures, (len(failures), failures[:5])
    assert all(n >= 100 for n in sent.values()), sent
    # Still serving every API after all of that.
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/embeddings", json={"model": EMBED, "input": "still here"})
    assert ok.status_code == 200, ok.text
    http.close()
