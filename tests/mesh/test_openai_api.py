"""The OpenAI API through Envoy and the split mesh, driven by the official SDK and raw HTTP."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from tests.mesh.conftest import DEMO, SECOND

pytestmark = pytest.mark.mesh

HELLO = "Hello! 👋 How can I help you today? 你好，世界。"
COUNT = "one two three four five six seven eight nine ten"


def ask(text):
    return [{"role": "user", "content": text}]


def test_models_lists_every_served_model(client, mesh):
    ids = {m.id for m in client.models.list().data}
    assert {DEMO, SECOND} <= ids
    assert client.models.retrieve(DEMO).id == DEMO  # id with a slash
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_non_stream_exact_text_and_usage(client):
    r = client.chat.completions.create(model=DEMO, messages=ask("Say hello"))
    assert r.choices[0].message.content == HELLO
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "stop"
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    u = r.usage
    assert u.prompt_tokens > 5 and u.completion_tokens > 5
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_chat_stream_with_usage(client):
    chunks = list(client.chat.completions.create(model=DEMO, messages=ask("Say hello"), stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == HELLO
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 5


def test_second_model_served_at_once(client):
    r = client.chat.completions.create(model=SECOND, messages=ask("Count to ten"))
    assert r.choices[0].message.content == COUNT and r.model == SECOND


def test_max_tokens_gives_length(client):
    r = client.chat.completions.create(model=DEMO, messages=ask("Count to ten"), max_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert COUNT.startswith(r.choices[0].message.content)


def test_stop_string_never_leaks_streaming_or_not(client):
    r = client.chat.completions.create(model=DEMO, messages=ask("Count to ten"), stop=["five"])
    assert r.choices[0].message.content == "one two three four "
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=DEMO, messages=ask("Count to ten"), stop=[" fi", "zzz"],
                                                 stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four"


def test_completions_stream_and_not(client):
    r = client.completions.create(model=DEMO, prompt="Count to ten", max_tokens=50)
    assert r.choices[0].text == COUNT and r.object == "text_completion"
    stream = list(client.completions.create(model=DEMO, prompt="Count to ten", max_tokens=50, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in stream if c.choices) == COUNT
    assert stream[-1].usage.prompt_tokens > 0


def test_n_and_batch_prompts(client):
    r = client.completions.create(model=DEMO, prompt=["Say hello", "Count to ten"], max_tokens=50, n=2,
                                  temperature=0.7)
    texts = {c.index: c.text for c in r.choices}
    assert texts == {0: HELLO, 1: HELLO, 2: COUNT, 3: COUNT}
    c = client.chat.completions.create(model=DEMO, messages=ask("Count to ten"), n=3, temperature=1.0)
    assert sorted(ch.index for ch in c.choices) == [0, 1, 2]
    assert all(ch.message.content == COUNT for ch in c.choices)


def test_logprobs_are_returned(client):
    r = client.chat.completions.create(model=DEMO, messages=ask("Count to ten"), logprobs=True, top_logprobs=2,
                                       max_tokens=4)
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and "".join(t.token for t in content) == r.choices[0].message.content


def test_repeated_prompt_reports_cached_tokens(client):
    prompt = "Tell me a story about " + "the mesh and its many services " * 20
    cached = [client.chat.completions.create(model=DEMO, messages=ask(prompt), max_tokens=2)
              .usage.prompt_tokens_details.cached_tokens for _ in range(4)]
    assert max(cached) > 0


# ---- wire details and errors, with raw HTTP ------------------------------------------------------------------------

def post(mesh, path, body, **kw):
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(f"{mesh.url}{path}", content=data, headers={"content-type": "application/json"}, timeout=30,
                      **kw)


def test_sse_wire_format(mesh):
    with httpx.stream("POST", f"{mesh.url}/v1/chat/completions", timeout=30,
                      json={"model": DEMO, "messages": ask("Say hello"), "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw())
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    assert all(e.startswith(b"data: {") for e in events[:-2])


BAD = [
    ("invalid json", b"{not json", 400, None),
    ("missing messages", {"model": DEMO}, 400, "messages"),
    ("empty messages", {"model": DEMO, "messages": []}, 400, "messages"),
    ("wrong type", {"model": DEMO, "messages": "hi"}, 400, "messages"),
    ("max_tokens zero", {"model": DEMO, "messages": ask("x"), "max_tokens": 0}, 400, "max_tokens"),
    ("temperature", {"model": DEMO, "messages": ask("x"), "temperature": 9}, 400, "temperature"),
    ("top_p", {"model": DEMO, "messages": ask("x"), "top_p": -1}, 400, "top_p"),
    ("unknown field", {"model": DEMO, "messages": ask("x"), "bogus": True}, 400, "bogus"),
    ("unknown model", {"model": "nope", "messages": ask("x")}, 404, "model"),
    ("context window", {"model": DEMO, "messages": ask("word " * 5000)}, 400, None),
]


@pytest.mark.parametrize("name,body,status,param", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_input_is_a_clean_4xx_with_openai_error(mesh, name, body, status, param, stream):
    if stream and isinstance(body, dict):
        body = {**body, "stream": True}
    r = post(mesh, "/v1/chat/completions", body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["message"] and err["type"] and "code" in err and "param" in err
    if param:
        assert err["param"] == param
    assert "grpc-status" not in r.headers


def test_sdk_raises_typed_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=ask("x"), temperature=5)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=ask("x"))


def test_too_large_body_is_413(mesh):
    big = {"model": DEMO, "messages": ask("a" * (33 << 20))}
    r = post(mesh, "/v1/chat/completions", big)
    assert r.status_code == 413
    assert r.json()["error"]["message"]


def test_unknown_route_is_404_json(mesh):
    r = httpx.get(f"{mesh.url}/v1/nope", timeout=10)
    assert r.status_code == 404 and "error" in r.json()


def test_health_and_live(mesh):
    h = httpx.get(f"{mesh.url}/health", timeout=10)
    assert h.status_code == 200 and h.json()["status"] == "healthy"
    assert DEMO in h.json()["models"]
    live = httpx.get(f"{mesh.url}/live", timeout=10)
    assert live.status_code == 200 and live.json()["status"] == "live"


def test_http2_cleartext_works(mesh):
    with httpx.Client(http1=False, http2=True, timeout=30) as c:
        r = c.post(f"{mesh.url}/v1/chat/completions", json={"model": DEMO, "messages": ask("Say hello")})
    assert r.status_code == 200 and r.http_version == "HTTP/2"
    assert r.json()["choices"][0]["message"]["content"] == HELLO


def test_the_gateway_warms_every_worker_and_is_ready_only_after_a_warm_up(mesh):
    """services/gateway/warmup.py: one pinned request per worker; gRPC health (what Envoy probes) waited."""
    import re

    log = (mesh.log_dir / "gateway-0.log").read_text(errors="replace")
    warmed = re.findall(r"worker (\S+) \((\S+)\) warm in", log)
    assert sorted(model for _, model in warmed) == sorted([DEMO, DEMO, SECOND])  # every worker, once
    assert re.search(r"worker \S+ \(\S+\) warm in", log[:log.index("gateway ready")])
