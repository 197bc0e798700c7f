"""Response shapes: SSE frames, usage chunk, folded bodies."""

import orjson
import pytest

from services.gateway.core.delta import Delta
from services.gateway.openai.render import renderer_for

pytestmark = pytest.mark.unit


def frames(data: bytes):
    out = []
    for part in data.decode().split("\n\n"):
        if part:
            assert part.startswith("data: ")
            out.append(part[6:])
    return out


def test_chat_stream_role_once_finish_usage_and_done():
    r = renderer_for(chat=True, request_id="chatcmpl-1", model="m", n_choices=1, want_logprobs=False,
                         include_usage=True)
    a = frames(r.sse([Delta(0, "Hel", completion_tokens=1, prompt_tokens=7, cached_tokens=4, counts_prompt=True),
                      Delta(0, "lo", completion_tokens=2)]))
    b = frames(r.sse([Delta(0, "", finish_reason="stop")]))
    end = frames(r.sse_end())
    first, second = (orjson.loads(x) for x in a)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert second["choices"][0]["delta"] == {"content": "lo"}
    assert first["usage"] is None and first["object"] == "chat.completion.chunk"
    assert orjson.loads(b[0])["choices"][0]["finish_reason"] == "stop"
    usage = orjson.loads(end[0])
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 7, "completion_tokens": 3,
                                                         "total_tokens": 10,
                                                         "prompt_tokens_details": {"cached_tokens": 4}}
    assert end[1] == "[DONE]"


def test_no_usage_chunk_without_include_usage():
    r = renderer_for(chat=False, request_id="cmpl-1", model="m", n_choices=1, want_logprobs=False,
                         include_usage=False)
    assert frames(r.sse_end()) == ["[DONE]"]


def test_fold_chat_and_completion_with_echo():
    r = renderer_for(chat=True, request_id="c", model="m", n_choices=2, want_logprobs=False, include_usage=False)
    r.fold([Delta(0, "a", completion_tokens=1, prompt_tokens=5, counts_prompt=True), Delta(1, "b", completion_tokens=1,
                                                                                          prompt_tokens=5)])
    r.fold([Delta(0, "c", finish_reason="length", completion_tokens=1), Delta(1, "", finish_reason="stop",
                                                                              stop_reason="END")])
    body = orjson.loads(r.body())
    assert body["object"] == "chat.completion"
    assert [c["message"]["content"] for c in body["choices"]] == ["ac", "b"]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "stop"]
    assert body["choices"][1]["stop_reason"] == "END"
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 3
    e = renderer_for(chat=False, request_id="x", model="m", n_choices=1, want_logprobs=False, include_usage=False,
                         echo_prompts=["Q: "])
    e.fold([Delta(0, "A", finish_reason="stop")])
    assert orjson.loads(e.body())["choices"][0]["text"] == "Q: A"
