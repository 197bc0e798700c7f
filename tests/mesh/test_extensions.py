"""nvext, current OpenAI and vendor fields, image parts and --chat-template, through Envoy with the openai SDK.

Its own mesh, in both shapes (split and all-in-one), planned the way ``meshfront run --chat-template FILE``
plans one: two image-declaring
mockers for the demo model, one plain mocker (slow, one request at a time) for the second model,
and a router that makes requests for a busy model wait in priority order.
"""

from __future__ import annotations

import base64
import threading
import time

import openai
import orjson
import pytest

from services.launcher.run import STAGES, parse_args
from tests.conftest import sdk_client, stop_cleanly
from tests.media_samples import data_url, png
from tests.mesh.conftest import DEMO, DEMO_PARSERS, SECOND, mocker, start_mesh

pytestmark = pytest.mark.mesh

MARKER = "meshfront-custom-template"
# A ChatML template that renders image parts (so the preprocessor hands it parts) and says who made it.
TEMPLATE = (
    "<|im_start|>system\n" + MARKER + "<|im_end|>\n"
    "{%- for m in messages %}\n<|im_start|>{{ m.role }}\n"
    "{%- if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% elif p.type == 'text' %}"
    "{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>{% endfor %}\n"
    "{%- if add_generation_prompt %}\n<|im_start|>assistant\n{% endif %}")
IMAGE_TOKENS = 64  # 224 x 224 px in Qwen2-VL's 28 px tiles: 8 x 8
PNG = base64.b64encode(png(224, 224)).decode()
OTHER_PNG = data_url(png(224, 224, seed=1))


@pytest.fixture(scope="module", params=[False, True], ids=["split", "allinone"])
def ext_mesh(request, tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    args = parse_args(["--chat-template", str(template), *(["--inproc"] if request.param else [])])
    service_args = {stage: tuple(getattr(args, f"{stage}_flag")) for stage in STAGES}
    service_args["router"] = ("--max-in-flight-per-worker", "1", "--queue-timeout-s", "60")
    image = ("--input-modalities", "image", "--image-tokens", str(IMAGE_TOKENS))
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS, *image),
                                      mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS, *image),
                                      mocker(demo_model_dir, SECOND, "1")], service_args=service_args,
                   inproc=args.inproc)
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(ext_mesh):
    c = sdk_client(ext_mesh, timeout=60)
    yield c
    c.close()


def ask(text):
    return [{"role": "user", "content": text}]


def worker_of(response) -> str:
    return response.model_extra["nvext"]["worker_id"]["decode_worker_id"]


# --- current OpenAI and vendor fields ------------------------------------------------------------

EVERY_NEW_OPENAI_FIELD = {
    "store": False, "metadata": {"team": "search", "run": "42"}, "modalities": ["text"],
    "audio": {"format": "wav", "voice": "alloy"}, "prediction": {"type": "content", "content": "Hello"},
    "service_tier": "flex", "prompt_cache_key": "user-7", "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"}, "safety_identifier": "hash-123",
    "verbosity": "low", "reasoning_effort": "minimal", "user": "u-1",
    "stream_options": None,
}


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high", "xhigh", "max"])
def test_every_reasoning_effort_is_accepted(client, effort):
    r = client.chat.completions.create(model=DEMO, messages=ask("Say hello"), reasoning_effort=effort)
    assert r.choices[0].message.content.startswith("Hello")


def test_every_new_openai_field_is_accepted(client):
    fields = {k: v for k, v in EVERY_NEW_OPENAI_FIELD.items() if v is not None}
    r = client.chat.completions.create(model=DEMO, messages=ask("Say hello"), **fields)
    assert r.choices[0].message.content.startswith("Hello")
    chunks = list(client.chat.completions.create(model=DEMO, messages=ask("Say hello"), stream=True,
                                                 stream_options={"include_usage": True,
                                                                 "include_obfuscation": False}, **fields))
    assert chunks[-1].usage.completion_tokens > 0


def test_vendor_fields_are_accepted(client):
    r = client.chat.completions.create(model=DEMO, messages=ask("Say hello"), extra_body={
        "thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": False}, "top_k": 20,
        "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 1, "ignore_eos": False,
        "skip_special_tokens": True, "include_stop_str_in_output": False, "stop_token_ids": [151643]})
    assert r.choices[0].message.content.startswith("Hello")
    for thinking in (True, {"type": "enabled", "budget_tokens": 64}, {"type": "auto"}):
        assert client.chat.completions.create(model=DEMO, messages=ask("Say hello"), max_tokens=2,
                                              extra_body={"thinking": thinking}).usage.completion_tokens == 2


@pytest.mark.parametrize("body,param", [
    ({"web_search_options": {}}, "web_search_options"),
    ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"verbosity": "loud"}, "verbosity"),
    ({"service_tier": "gold"}, "service_tier"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"prediction": {"type": "content"}}, "prediction.content"),
    ({"no_such_field": 1}, "no_such_field"),
    ({"nvext": {"no_such_ext": 1}}, "nvext.no_such_ext"),
    ({"nvext": {"token_data": [1, 2]}}, "nvext.token_data"),
    ({"thinking": "yes"}, "thinking"),
])
def test_bad_or_unsupported_fields_are_400_naming_them(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=ask("Say hello"), extra_body=body)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param
    assert param.split(".")[-1] in e.value.body["message"]


# --- nvext ------------------------------------------------------------------------------------

def raw_stream(client, **kw) -> list[str]:
    with client.chat.completions.with_streaming_response.create(model=DEMO, stream=True, **kw) as r:
        return list(r.iter_lines())


def test_annotations_are_sse_events_before_the_first_chunk(client):
    lines = raw_stream(client, messages=ask("Say hello"),
                       extra_body={"nvext": {"annotations": ["request_id", "formatted_prompt", "token_ids"]}})
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    events = {}
    for i, line in enumerate(lines[:first_data]):
        if line.startswith("event: "):
            assert lines[i + 1].startswith(": ")  # Dynamo's shape: the value on a comment line, no data
            events[line[len("event: "):]] = orjson.loads(lines[i + 1][2:])
    assert set(events) == {"request_id", "formatted_prompt", "token_ids"}
    # --chat-template replaced the model directory's template.
    assert events["formatted_prompt"].startswith(f"<|im_start|>system\n{MARKER}")
    assert events["formatted_prompt"].endswith("<|im_start|>assistant\n")
    assert all(isinstance(t, int) for t in events["token_ids"]) and len(events["token_ids"]) > 5
    assert orjson.loads(lines[first_data][len("data: "):])["id"] == f"chatcmpl-{events['request_id']}"
    assert "data: [DONE]" in lines


def test_extra_fields_worker_id_and_timing(client):
    r = client.chat.completions.create(model=DEMO, messages=ask("Say hello"),
                                       extra_body={"nvext": {"extra_fields": ["worker_id", "timing"],
                                                             "annotations": ["token_ids"]}})
    ext = r.model_extra["nvext"]
    assert ext["worker_id"]["decode_worker_id"].startswith("mocker-")
    t = ext["timing"]
    assert 0 < t["ttft_ms"] <= t["total_time_ms"]
    assert t["prefill_wait_time_ms"] + t["prefill_time_ms"] == pytest.approx(t["ttft_ms"], abs=0.01)
    assert 0 <= t["kv_hit_rate"] <= 1 and t["request_received_ms"] > 1.7e12
    assert len(ext["token_ids"]) == r.usage.prompt_tokens
    # The second model's worker runs at real speed, so its answer arrives over several chunks.
    chunks = list(client.chat.completions.create(model=SECOND, messages=ask("Count to ten"), stream=True,
                                                 extra_body={"nvext": {"extra_fields": ["worker_id", "timing"]}}))
    assert len(chunks) > 2
    with_ext = [c.model_extra.get("nvext") for c in chunks]
    assert "worker_id" in with_ext[0] and "timing" not in with_ext[0]
    assert "timing" in with_ext[-1] and with_ext[-1]["timing"]["total_time_ms"] > 0
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_backend_instance_id_with_token_data(client):
    first = client.chat.completions.create(model=DEMO, messages=ask("Say hello"), extra_body={
        "nvext": {"extra_fields": ["worker_id"], "annotations": ["token_ids"]}})
    tokens = first.model_extra["nvext"]["token_ids"]
    workers = {worker_of(client.chat.completions.create(model=DEMO, messages=ask("Say hello"),
                                                        extra_body={"nvext": {"extra_fields": ["worker_id"]}}))
               for _ in range(4)}
    assert len(workers) == 2  # round-robin spreads unpinned requests
    for pin in sorted(workers):
        for _ in range(2):
            r = client.chat.completions.create(model=DEMO, messages=ask("ignored: token_data is the prompt"),
                                               extra_body={"nvext": {"backend_instance_id": pin,
                                                                     "token_data": tokens,
                                                                     "extra_fields": ["worker_id"]}})
            assert worker_of(r) == pin
            assert r.usage.prompt_tokens == len(tokens)
            assert r.choices[0].message.content == first.choices[0].message.content


def test_session_stickiness_across_requests(client):
    def worker(**ext):
        return worker_of(client.chat.completions.create(
            model=DEMO, messages=ask("Say hello"), extra_body={"nvext": {"extra_fields": ["worker_id"], **ext}}))

    assert len({worker() for _ in range(4)}) == 2  # without a session, round-robin alternates
    for session in ("conversation-a", "conversation-b"):
        seen = {worker(session_control={"session_id": session, "action": "open", "timeout": 60})}
        seen |= {worker(session_control={"session_id": session}) for _ in range(5)}
        assert len(seen) == 1, seen
    # OpenAI's prompt_cache_key is the same routing key.
    keyed = {worker_of(client.chat.completions.create(model=DEMO, messages=ask("Say hello"),
                                                      prompt_cache_key="tenant-9",
                                                      extra_body={"nvext": {"extra_fields": ["worker_id"]}}))
             for _ in range(5)}
    assert len(keyed) == 1


def test_ignored_engine_fields_are_named_in_a_header_and_rank_zero_pins_a_worker_without_ranks(client):
    """Data-parallel rank pins are honoured (services/router/dp_pins.py): a worker without ranks is rank 0, and a
    prefill rank pins nothing where the model has no prefill workers; neither is named as ignored."""
    r = client.chat.completions.with_raw_response.create(
        model=DEMO, messages=ask("Say hello"), extra_headers={"x-dp-rank": "0"},
        extra_body={"nvext": {"dp_rank": 0,
                              "prefill_dp_rank": 1, "agent_hints": {"osl": 100, "speculative_prefill": True},
                              "request_timestamp_ms": 1.5, "use_raw_prompt": False,
                              "extra_fields": ["routed_experts"], "max_thinking_tokens": 32,
                              "greed_sampling": True}})
    assert r.status_code == 200
    ignored = [f.strip() for f in r.headers["x-meshfront-ignored-fields"].split(",")]
    assert ignored == ["nvext.use_raw_prompt", "nvext.extra_fields[routed_experts]",
                       "nvext.request_timestamp_ms", "nvext.agent_hints.osl",
                       "nvext.agent_hints.speculative_prefill"]
    assert r.parse().choices[0].message.content.startswith("Hello")
    plain = client.chat.completions.with_raw_response.create(model=DEMO, messages=ask("Say hello"))
    assert "x-meshfront-ignored-fields" not in plain.headers


def test_priority_orders_requests_waiting_for_a_busy_model(client, ext_mesh):
    """One worker, one request at a time: while a long request runs, a low- then a high-priority one
    queue; the high one is served first."""
    finished: list[str] = []
    depth: dict[str, int] = {}
    errors: list[BaseException] = []

    def send(name: str, priority: int) -> None:
        try:
            r = client.chat.completions.create(
                model=SECOND, messages=ask(f"request {name}"), max_tokens=3,
                extra_body={"nvext": {"agent_hints": {"priority": priority}, "extra_fields": ["timing"]}})
            depth[name] = r.model_extra["nvext"]["timing"]["router_queue_depth"]
            finished.append(name)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    long = client.chat.completions.create(model=SECOND, messages=ask("long request"), max_tokens=400,
                                          extra_body={"ignore_eos": True}, stream=True)
    next(iter(long))  # it runs: the worker is now busy
    low = threading.Thread(target=send, args=("low", 0))
    low.start()
    time.sleep(0.5)
    high = threading.Thread(target=send, args=("high", 30))
    high.start()
    time.sleep(0.3)
    tail = list(long)
    low.join(60)
    high.join(60)
    assert not errors, errors
    assert tail[-1].choices[0].finish_reason == "length"
    assert finished == ["high", "low"]
    assert depth["low"] == 1 and depth["high"] == 2


# --- multimodal parts ---------------------------------------------------------------------------

def image_message(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "Say hello"},
                                         {"type": "image_url", "image_url": {"url": url, "detail": "low"}}]}]


def test_image_parts_reach_an_image_declaring_worker(client):
    text_only = client.chat.completions.create(model=DEMO, messages=ask("Say hello"), max_tokens=4)
    for url in (f"data:image/png;base64,{PNG}", OTHER_PNG):
        r = client.chat.completions.create(model=DEMO, messages=image_message(url), max_tokens=4,
                                           extra_body={"nvext": {"annotations": ["formatted_prompt"]}})
        prompt = r.model_extra["nvext"]["formatted_prompt"]
        assert "<|image_pad|>" in prompt and "Say hello" in prompt
        # The prompt grew by the template's vision markers plus the image's placeholder tokens.
        assert r.usage.prompt_tokens >= text_only.usage.prompt_tokens + IMAGE_TOKENS
    two = [{"role": "user", "content": image_message(f"data:image/png;base64,{PNG}")[0]["content"]
            + [{"type": "image_url", "image_url": {"url": OTHER_PNG}}]}]
    one = client.chat.completions.create(model=DEMO, messages=image_message(OTHER_PNG), max_tokens=2)
    r2 = client.chat.completions.create(model=DEMO, messages=two, max_tokens=2)
    assert r2.usage.prompt_tokens - one.usage.prompt_tokens >= IMAGE_TOKENS


@pytest.mark.parametrize(("url", "kind"), [("http://127.0.0.1:9/cat.png", "loopback"),
                                           ("http://localhost:9/cat.png", "loopback"),
                                           ("http://169.254.169.254/latest/meta-data", "link-local"),
                                           ("http://10.0.0.1/cat.png", "private"),
                                           ("http://[::ffff:127.0.0.1]/cat.png", "loopback")])
def test_private_addresses_are_refused_by_default(client, url, kind):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=image_message(url))
    message = e.value.body["message"]
    assert e.value.body["param"] == "messages[0].content" and f"a {kind}" in message, message
    assert "'messages[0].content[1].image_url.url'" in message and "--media-allow-private-urls" in message


def test_image_parts_to_a_model_without_image_support_are_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=SECOND, messages=image_message("https://example.com/cat.png"))
    assert f"`{SECOND}`" in e.value.body["message"] and "image" in e.value.body["message"]
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": PNG, "format": "wav"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=audio)
    assert f"`{DEMO}`" in e.value.body["message"] and "audio" in e.value.body["message"]


@pytest.mark.parametrize("url", ["ftp://example.com/a.png", "data:image/png;base64,@@@", "not a url",
                                 "data:text/plain;base64,aGk=", "https://"])
def test_malformed_image_urls_are_400(client, url):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=image_message(url))
    assert e.value.body["param"] == "messages[0].content"


def test_max_thinking_tokens_reaches_the_worker(client):
    """The mocker enforces a thinking budget: its scripted thinking is cut and closed, the answer stays."""
    full = client.chat.completions.create(model=DEMO, messages=ask("What is 2+2"))
    reasoning = full.choices[0].message.model_extra["reasoning_content"]
    assert "Two plus two is four." in reasoning and full.choices[0].message.content.endswith("2 + 2 = 4.")
    for body in ({"nvext": {"max_thinking_tokens": 2}}, {"thinking": {"type": "enabled", "budget_tokens": 2}}):
        cut = client.chat.completions.create(model=DEMO, messages=ask("What is 2+2"), extra_body=body)
        short = cut.choices[0].message.model_extra["reasoning_content"]
        assert 0 < len(short) < len(reasoning) and reasoning.startswith(short.rstrip())
        assert cut.choices[0].message.content == full.choices[0].message.content
        assert cut.usage.completion_tokens < full.usage.completion_tokens


def test_a_large_inline_image_crosses_every_hop(client):
    big = png(1100, 1000, seed=7)  # 3.3 MB of noise: a 4.4 MB data URL, beyond gRPC's default limit
    assert len(big) > 3 * 1024 * 1024
    r = client.chat.completions.create(model=DEMO, messages=image_message(data_url(big)), max_tokens=2)
    assert r.usage.prompt_tokens > 39 * 36 and r.usage.completion_tokens == 2  # 1092 x 1008 px resized


def test_odd_annotation_names_are_echoed_safely(client):
    r = client.chat.completions.with_raw_response.create(
        model=DEMO, messages=ask("Say hello"), extra_body={"nvext": {"annotations": ["日本\r\nx-evil: 1"]}})
    assert r.status_code == 200 and "x-evil" not in r.headers
    assert r.headers["x-meshfront-ignored-fields"] == "nvext.annotations[%E6%97%A5%E6%9C%AC%0D%0Ax-evil:%201]"
