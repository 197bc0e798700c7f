"""Parsing and mapping of the current OpenAI fields, vendor thinking fields, nvext and content parts."""

from __future__ import annotations

import base64

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.core.to_proto import chat_to_preprocess, completion_to_preprocess
from services.gateway.core.trace import RequestTrace, TracedPrompt
from services.gateway.openai.extensions import ResponseExtensions

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(8)).decode()


def chat(**fields) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return orjson.dumps(body)


def rejects(raw: bytes, param: str) -> str:
    with pytest.raises(InvalidRequest) as e:
        parse_chat(raw)
    assert e.value.http_status == 400
    assert e.value.param == param, e.value.message
    return e.value.message


# --- current OpenAI fields ---------------------------------------------------------------------

def test_every_current_openai_field_is_accepted():
    req = parse_chat(chat(
        store=True, metadata={"a": "b"}, modalities=["text"], audio={"format": "mp3", "voice": {"id": "v1"}},
        prediction={"type": "content", "content": [{"type": "text", "text": "x"}]}, service_tier="priority",
        prompt_cache_key="k", prompt_cache_retention="in_memory", prompt_cache_options={"ttl": "30m"},
        safety_identifier="s", verbosity="high", reasoning_effort="xhigh", user="u", stream=True,
        stream_options={"include_usage": True, "include_obfuscation": True}))
    assert req.chat_template_kwargs == {"reasoning_effort": "xhigh", "verbosity": "high"}
    assert req.session_id == "k" and req.include_usage


@pytest.mark.parametrize("effort", ["minimal", "low", "medium", "high", "xhigh", "max"])
def test_reasoning_effort_reaches_the_template(effort):
    assert parse_chat(chat(reasoning_effort=effort)).chat_template_kwargs == {"reasoning_effort": effort}


def test_reasoning_effort_none_turns_thinking_off_and_own_kwargs_win():
    assert parse_chat(chat(reasoning_effort="none")).chat_template_kwargs == {"enable_thinking": False}
    req = parse_chat(chat(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}))
    assert req.chat_template_kwargs == {"enable_thinking": True}


@pytest.mark.parametrize("fields,param", [
    ({"web_search_options": {"search_context_size": "low"}}, "web_search_options"),
    ({"moderation": {"model": "x"}}, "moderation"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"modalities": ["video"]}, "modalities"),
    ({"audio": {"format": "ogg", "voice": "alloy"}}, "audio.format"),
    ({"audio": {"format": "wav"}}, "audio.voice"),
    ({"audio": {"format": "wav", "voice": "alloy", "speed": 1}}, "audio.speed"),
    ({"metadata": {"k" * 65: "v"}}, "metadata"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata.k"),
    ({"prediction": {"type": "diff", "content": "x"}}, "prediction.type"),
    ({"prediction": {"type": "content", "content": [{"type": "image_url"}]}}, "prediction.content"),
    ({"service_tier": "premium"}, "service_tier"),
    ({"prompt_cache_retention": "1h"}, "prompt_cache_retention"),
    ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl"),
    ({"prompt_cache_key": 5}, "prompt_cache_key"),
    ({"safety_identifier": []}, "safety_identifier"),
    ({"verbosity": "max"}, "verbosity"),
    ({"reasoning_effort": "ultra"}, "reasoning_effort"),
    ({"store": "yes"}, "store"),
    ({"stream": True, "stream_options": {"include_obfuscation": 1}}, "stream_options.include_obfuscation"),
    ({"bogus": 1, "another": 2}, "another"),
])
def test_bad_values_are_400_naming_the_field(fields, param):
    rejects(chat(**fields), param)


def test_unknown_fields_are_all_named():
    assert "'another', 'bogus'" in rejects(chat(bogus=1, another=2), "another")


# --- vendor fields -----------------------------------------------------------------------------

@pytest.mark.parametrize("fields,kwargs,budget", [
    ({"thinking": {"type": "enabled"}}, {"enable_thinking": True, "thinking": True}, None),
    ({"thinking": {"type": "disabled"}}, {"enable_thinking": False, "thinking": False}, None),
    ({"thinking": {"type": "auto", "budget_tokens": 100}}, {}, 100),
    ({"thinking": False}, {"enable_thinking": False, "thinking": False}, None),
    ({"enable_thinking": True}, {"enable_thinking": True, "thinking": True}, None),
])
def test_root_thinking_fields(fields, kwargs, budget):
    req = parse_chat(chat(**fields))
    assert req.chat_template_kwargs == kwargs
    assert req.sampling.max_thinking_tokens == budget


@pytest.mark.parametrize("fields,param", [
    ({"thinking": "on"}, "thinking"),
    ({"thinking": {"type": "maybe"}}, "thinking.type"),
    ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "effort": 1}}, "thinking.effort"),
    ({"thinking": {"type": "enabled"}, "enable_thinking": False}, "thinking"),
    ({"enable_thinking": 1}, "enable_thinking"),
    ({"stop_token_ids": [1, -1]}, "stop_token_ids"),
])
def test_bad_vendor_fields(fields, param):
    rejects(chat(**fields), param)


def test_stop_token_ids_are_hidden_stop_ids():
    out = chat_to_preprocess(parse_chat(chat(stop_token_ids=[7, 9])), "r")
    assert list(out.request.stop.stop_token_ids_hidden) == [7, 9]


# --- nvext -------------------------------------------------------------------------------------

def test_nvext_fields_map_to_the_mesh():
    req = parse_chat(chat(temperature=0.7, top_p=0.9, top_k=5, nvext={
        "greed_sampling": True, "annotations": ["request_id", "token_ids", "formatted_prompt"],
        "backend_instance_id": 12, "token_data": [5, 6, 7], "max_thinking_tokens": 50,
        "extra_fields": ["worker_id", "timing"], "agent_hints": {"priority": 7},
        "session_control": {"session_id": "s1", "action": "close", "timeout": 30}}))
    s = req.sampling
    assert (s.temperature, s.top_p, s.top_k) == (0.0, None, 5)  # greedy: no temperature, no nucleus cut
    ext = req.nvext
    assert req.worker_id == "12" and ext.token_data == [5, 6, 7]
    assert ext.priority_jump_s == 7 and ext.extra_fields == ("worker_id", "timing")
    assert (req.session_id, ext.session_action, ext.session_timeout_s) == ("s1", "close", 30)
    assert ext.ignored == []
    out = chat_to_preprocess(req, "r")
    assert out.WhichOneof("prompt") == "tokens" and list(out.tokens.ids) == [5, 6, 7]
    assert out.request.stop.max_thinking_tokens == 50
    assert list(out.request.annotations) == ["request_id", "token_ids", "formatted_prompt"]
    assert out.return_formatted_prompt


def test_nvext_priority_from_the_deprecated_alias_and_never_negative():
    assert parse_chat(chat(nvext={"agent_hints": {"latency_sensitivity": 2.5}})).nvext.priority_jump_s == 2.5
    assert parse_chat(chat(nvext={"agent_hints": {"priority": -4}})).nvext.priority_jump_s == 0


def test_session_from_prompt_cache_key_unless_nvext_names_one():
    assert parse_chat(chat(prompt_cache_key="p")).session_id == "p"
    assert parse_chat(chat(prompt_cache_key="p", nvext={"session_control": {"session_id": "s"}})).session_id == "s"


def test_engine_only_fields_are_listed_as_ignored_and_data_parallel_ranks_are_pins():
    req = parse_chat(chat(nvext={"prefill_worker_id": "p", "decode_worker_id": 3, "dp_rank": 0,
                                 "prefill_dp_rank": 4294967295, "agent_hints": {"osl": 9, "speculative_prefill": False},
                                 "request_timestamp_ms": 0, "use_raw_prompt": True,
                                 "annotations": ["query_instance_id:x"], "extra_fields": ["routed_experts"]}),
                     {"x-prefill-instance-id": "p", "x-dp-rank": "1"})
    assert req.nvext.ignored == [
        "nvext.use_raw_prompt", "nvext.annotations[query_instance_id:x]", "nvext.extra_fields[routed_experts]",
        "nvext.request_timestamp_ms", "nvext.agent_hints.osl", "nvext.agent_hints.speculative_prefill"]
    # The header wins over the body; Dynamo's 4294967295 is no rank.
    assert (req.pins.dp_rank, req.pins.prefill_dp_rank) == (1, None)
    hints = req.route_hints()
    assert (hints.dp_rank, hints.prefill_dp_rank) == (1, None)
    assert ("nvext.dp_rank", "x-dp-rank") in hints.pin_names  # the router's 400 names the header the client used
    req = parse_chat(chat(nvext={"dp_rank": 3, "prefill_dp_rank": 2}), {"x-prefill-dp-rank": "4294967295"})
    assert (req.pins.dp_rank, req.pins.prefill_dp_rank) == (3, 2)


@pytest.mark.parametrize(("nvext", "headers", "param"), [
    ({}, {"x-dp-rank": "one"}, "x-dp-rank"),
    ({}, {"x-prefill-dp-rank": "-1"}, "x-prefill-dp-rank"),
    ({}, {"x-dp-rank": "4294967296"}, "x-dp-rank"),
    ({"dp_rank": -1}, {}, "nvext.dp_rank"),
    ({"prefill_dp_rank": "0"}, {}, "nvext.prefill_dp_rank"),
])
def test_a_bad_data_parallel_rank_is_a_400_naming_it(nvext, headers, param):
    with pytest.raises(InvalidRequest) as e:
        parse_chat(chat(nvext=nvext), headers)
    assert e.value.param == param


def test_disaggregated_pins_are_honoured_the_header_over_the_body():
    req = parse_chat(chat(nvext={"prefill_worker_id": "p", "decode_worker_id": 3}))
    assert (req.pins.prefill_worker_id, req.pins.decode_worker_id, req.nvext.ignored) == ("p", "3", [])
    req = parse_chat(chat(nvext={"prefill_worker_id": "p"}), {"x-prefill-instance-id": "h"})
    assert req.pins.prefill_worker_id == "h"
    assert parse_chat(chat(), {"x-prefill-instance-id": "h"}).pins.prefill_worker_id == "h"


@pytest.mark.parametrize(("nvext", "headers", "param"), [
    ({"prefill_worker_id": True}, {}, "nvext.prefill_worker_id"),
    ({"decode_worker_id": -1}, {}, "nvext.decode_worker_id"),
    ({"decode_worker_id": "x" * 200}, {}, "nvext.decode_worker_id"),
    ({}, {"x-prefill-instance-id": "x" * 200}, "x-prefill-instance-id"),  # what the client sent: the header
])
def test_a_malformed_disaggregated_pin_is_a_400_naming_it(nvext, headers, param):
    with pytest.raises(InvalidRequest) as e:
        parse_chat(chat(nvext=nvext), headers)
    assert e.value.param == param


def test_unknown_annotation_names_are_header_safe():
    req = parse_chat(chat(nvext={"annotations": ["日本\r\nx-evil: 1", "query_instance_id:a b"]}))
    assert req.nvext.ignored == ["nvext.annotations[%E6%97%A5%E6%9C%AC%0D%0Ax-evil:%201]",
                                 "nvext.annotations[query_instance_id:a%20b]"]
    assert all(h.isascii() and h.isprintable() for h in req.nvext.ignored)


@pytest.mark.parametrize("nvext,param", [
    ({"annotations": ["a"] * 33}, "nvext.annotations"),
    ({"annotations": ["a" * 257]}, "nvext.annotations"),
    ({"greed_sampling": 1}, "nvext.greed_sampling"),
    ({"annotations": "request_id"}, "nvext.annotations"),
    ({"annotations": [1]}, "nvext.annotations"),
    ({"token_data": [1]}, "nvext.token_data"),
    ({"backend_instance_id": "w", "token_data": []}, "nvext.token_data"),
    ({"backend_instance_id": "w", "token_data": [-1]}, "nvext.token_data"),
    ({"max_thinking_tokens": -1}, "nvext.max_thinking_tokens"),
    ({"extra_fields": ["latency"]}, "nvext.extra_fields"),
    ({"prefill_worker_id": 1.5}, "nvext.prefill_worker_id"),
    ({"dp_rank": -1}, "nvext.dp_rank"),
    ({"agent_hints": {"priority": 2**31}}, "nvext.agent_hints.priority"),
    ({"agent_hints": {"priority": 1, "urgency": 2}}, "nvext.agent_hints.urgency"),
    ({"agent_hints": {"latency_sensitivity": "high"}}, "nvext.agent_hints.latency_sensitivity"),
    ({"session_control": {"action": "open"}}, "nvext.session_control.session_id"),
    ({"session_control": {"session_id": "s", "action": "pause"}}, "nvext.session_control.action"),
    ({"session_control": {"session_id": "s", "timeout": 0}}, "nvext.session_control.timeout"),
    ({"request_timestamp_ms": "now"}, "nvext.request_timestamp_ms"),
    ({"nothing": 1}, "nvext.nothing"),
])
def test_bad_nvext_fields(nvext, param):
    rejects(chat(nvext=nvext), param)


def test_greedy_with_several_choices_is_refused():
    rejects(chat(n=2, nvext={"greed_sampling": True}), "n")


def test_completions_take_nvext_too():
    req = parse_completion(orjson.dumps({"model": "m", "prompt": "hi", "nvext": {
        "backend_instance_id": "w", "token_data": [3, 4], "annotations": ["token_ids"]}}))
    out = completion_to_preprocess(req, req.prompts[0], "r")
    assert list(out.tokens.ids) == [3, 4] and list(out.request.annotations) == ["token_ids"]


# --- response side -----------------------------------------------------------------------------

def test_annotation_events_and_response_nvext():
    req = parse_chat(chat(nvext={"annotations": ["request_id", "formatted_prompt", "token_ids", "other"],
                                 "extra_fields": ["worker_id", "timing"]}))
    trace = RequestTrace()
    trace.prompts = [TracedPrompt([1, 2], "<p>")]
    trace.on_routed(0, "w1", 0)
    ext = ResponseExtensions(req.nvext, trace, "rid")
    assert ext.annotation_events() == (b'event: request_id\n: "rid"\n\nevent: formatted_prompt\n: "<p>"\n\n'
                                       b"event: token_ids\n: [1,2]\n\n")
    assert ext.headers() == (("x-meshfront-ignored-fields", "nvext.annotations[other]"),)
    first = ext.chunk_nvext(0, first=True, final=False)
    assert first == {"worker_id": {"prefill_worker_id": "w1", "decode_worker_id": "w1"}}
    assert ext.chunk_nvext(0, first=False, final=False) is None
    trace.on_output(10, 4, finished=True)
    timing = ext.chunk_nvext(0, first=False, final=True)["timing"]
    assert timing["kv_hit_rate"] == 0.4 and timing["ttft_ms"] <= timing["total_time_ms"]
    body = ext.body_nvext()
    assert body["request_id"] == "rid" and body["token_ids"] == [1, 2] and body["formatted_prompt"] == "<p>"
    trace.on_output(0, 0, finished=True, index=0, moved_to="w2")  # migrated: the new worker is reported
    assert ext.body_nvext()["worker_id"]["decode_worker_id"] == "w2"


# --- content parts -----------------------------------------------------------------------------

def parts(*content) -> bytes:
    return chat(messages=[{"role": "user", "content": list(content)}])


def test_image_and_audio_parts_become_media_in_order():
    req = parse_chat(parts({"type": "text", "text": "look"},
                           {"type": "image_url", "image_url": {"url": "https://x.org/a.png", "detail": "high"}},
                           {"type": "input_audio", "input_audio": {"data": PNG, "format": "mp3"}},
                           {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}))
    out = chat_to_preprocess(req, "r")
    media = [(m.modality, m.part_index, m.detail, m.format) for m in out.request.media]
    assert media == [("image", 1, "high", ""), ("audio", 2, "", "mp3"), ("image", 3, "", "")]
    assert out.request.media[0].url == "https://x.org/a.png" and out.request.media[1].data == PNG


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
    {"type": "image_url", "image_url": {"url": "http://"}},
    {"type": "image_url", "image_url": {"url": "http://[::1"}},
    {"type": "image_url", "image_url": {"url": "https://x.org/a b.png"}},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}},
    {"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}},
    {"type": "image_url", "image_url": {"url": "https://x.org/a.png", "detail": "ultra"}},
    {"type": "image_url", "image_url": {"url": "https://x.org/a.png", "size": 1}},
    {"type": "image_url", "image_url": "https://x.org/a.png"},
    {"type": "input_audio", "input_audio": {"data": PNG, "format": "ogg"}},
    {"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}},
    {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
    {"type": "file", "file": {"file_id": "f"}},
    {"type": "video_url", "video_url": {"url": "ftp://x.org/v.mp4"}},
    {"type": "video_url", "video_url": {"url": f"data:image/png;base64,{PNG}"}},  # an image as a video
    {"type": "image_url", "image_url": {"url": f"data:video/mp4;base64,{PNG}"}},  # a video as an image
    {"type": "video_url", "video_url": {"url": "https://x.org/v.mp4", "detail": "low"}},
    {"type": "image_url", "image_url": None},  # null needs a uuid naming an earlier image
    {"type": "image_url"},
    {"type": "image_url", "image_url": {"url": "https://x.org/a.png"}, "uuid": 5},
    {"type": "image_url", "image_url": {"url": "https://x.org/a.png"}, "uuid": ""},
    {"type": "image_url", "image_url": {"url": "https://x.org/a.png"}, "uuid": "u" * 257},
    {"type": "text", "text": 5},
    "just a string",
])
def test_malformed_parts_are_400(part):
    rejects(parts(part), "messages[0].content")


def test_bad_parts_name_the_field():
    assert "'messages[0].content[0].uuid'" in rejects(parts({"type": "image_url", "uuid": 5}), "messages[0].content")
    msg = rejects(parts({"type": "video_url", "video_url": {"url": "data:image/png;base64,AAAA"}}),
                  "messages[0].content")
    assert "'messages[0].content[0].video_url.url'" in msg and "data:video/" in msg


def test_video_and_uuid_parts_become_media():
    req = parse_chat(parts({"type": "image_url", "image_url": {"url": "https://x.org/a.png"}, "uuid": "cat"},
                           {"type": "video_url", "video_url": {"url": "https://x.org/v.mp4"}},
                           {"type": "image_url", "image_url": None, "uuid": "cat"},
                           {"type": "image_url", "uuid": "cat"},
                           {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{PNG}"}, "uuid": "v"}))
    media = [(m.modality, m.url[:10], m.uuid) for m in chat_to_preprocess(req, "r").request.media]
    assert media == [("image", "https://x.", "cat"), ("video", "https://x.", ""), ("image", "", "cat"),
                     ("image", "", "cat"), ("video", "data:video", "v")]


def test_media_only_in_user_messages():
    raw = chat(messages=[{"role": "system", "content": [
        {"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}]}, {"role": "user", "content": "hi"}])
    assert "only allowed in user messages" in rejects(raw, "messages[0].content")
