"""The byte-template fast path of ``ChatRenderer.sse`` and ``CompletionRenderer.sse`` against a frozen
copy of the dict renderer.

``LegacyRenderer``, ``LegacyDelta`` and ``legacy_delta`` (bench/legacy_render.py) are the chunk rendering and
proto-to-delta code as they were before the fast path, kept unchanged as the oracle (and as the "before" side of
``python -m bench.render``): every chunk, the usage chunk, the nvext calls and the usage totals must
come out the same for any delta sequence.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2

from bench.legacy_render import LegacyDelta, LegacyRenderer, legacy_delta
from services.gateway.core.delta import Delta
from services.gateway.core.pipeline import Pipeline
from services.gateway.openai.render import ChatRenderer, CompletionRenderer, renderer_for

pytestmark = pytest.mark.unit




class FakeNvext:
    """Returns fields on first/final chunks like ResponseExtensions and, in ``every`` mode, on some middle
    chunks too (which must leave the fast path); logs its calls so both renderers can be held to the same."""

    def __init__(self, mode: str):
        self.mode = mode
        self.calls: list[tuple[int, bool, bool]] = []

    def chunk_nvext(self, index: int, first: bool, final: bool) -> dict[str, Any] | None:
        self.calls.append((index, first, final))
        out: dict[str, Any] = {}
        if self.mode in ("worker", "every") and (first or final):
            out["worker_id"] = {"prefill_worker_id": f"w{index}", "decode_worker_id": f"w\"{index}"}
        if self.mode in ("timing", "every") and final:
            out["timing"] = {"total_ms": 12.5, "ttft_ms": None}
        if self.mode == "every" and len(self.calls) % 3 == 0:
            out["tick"] = len(self.calls)
        return out or None

    def body_nvext(self) -> dict[str, Any] | None:
        return None


ALPHABET = ["a", "b", " ", "Hello", "'", '"', "\\", "\\\"", "/", "\n", "\r\n", "\t", "\x00", "\x01", "\x1f",
            "\x7f", "\x80", "é", "ß", "中文", "\u2028", "\u2029", "😀", "\U0001f469\u200d\U0001f469\u200d\U0001f467",
            "\ufeff", "\ud7ff", "\U0010ffff", "</script>", "{", "}", "[]", ":", ","]


def _text(rng: random.Random, max_parts: int = 3) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, max_parts)))


def _logprobs(rng: random.Random) -> list[postprocessor_pb2.TokenText]:
    def top() -> list[postprocessor_pb2.TopTokenText]:
        return [postprocessor_pb2.TopTokenText(token=_text(rng, 1), logprob=-rng.random() * 9)
                for _ in range(rng.randint(0, 2))]
    return [postprocessor_pb2.TokenText(token=_text(rng, 1), logprob=-rng.random() * 5, top=top())
            for _ in range(rng.randint(1, 2))]


def _choice_deltas(rng: random.Random, index: int, counts_prompt: bool) -> list[Delta]:
    """One choice's stream: a first delta (maybe empty), mostly plain text, some odd ones, a finish."""
    out = [Delta(index, rng.choice(["", _text(rng)]), completion_tokens=rng.randint(0, 1),
                 prompt_tokens=rng.randint(1, 50), cached_tokens=rng.randint(0, 16), counts_prompt=counts_prompt)]
    call = 0
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        d = Delta(index, _text(rng), completion_tokens=1)
        if kind < 0.1:
            d.text = ""
        elif kind < 0.2:
            d.logprobs = _logprobs(rng)
        elif kind < 0.3:
            d.reasoning = _text(rng)
            d.text = rng.choice(["", d.text])
        elif kind < 0.4:
            name = rng.random() < 0.5
            d.tool_calls = [postprocessor_pb2.ToolCallDelta(index=call, id=f"call_{call}" if name else "",
                                                            name="get_weather" if name else "",
                                                            arguments=rng.choice(["", '{"city": "', _text(rng)]))]
            call += name
            d.text = rng.choice(["", d.text])
        out.append(d)
    finish = rng.choice(["stop", "stop", "length", "tool_calls", ""])  # "" only by type: FINISH never maps to it
    out.append(Delta(index, rng.choice(["", _text(rng)]), finish_reason=finish,
                     stop_reason=rng.choice(["", "", "END", "\n\n"]), completion_tokens=rng.randint(0, 1),
                     logprobs=_logprobs(rng) if rng.random() < 0.2 else []))
    return out


def _request(rng: random.Random, chat: bool) -> tuple[dict[str, Any], list[list[Delta]]]:
    n_prompts = 1 if chat else rng.choice([1, 1, 2, 3])
    n = rng.choice([1, 1, 1, 2, 3, 12])  # 12: two-digit choice indexes in the templates
    total = n_prompts * n
    echo = [_text(rng, 4) for _ in range(n_prompts)] if not chat and rng.random() < 0.3 else None
    kwargs = {"chat": chat, "request_id": rng.choice(["chatcmpl-1", "cmpl-\"é\\x", "id-😀\n"]),
              "model": rng.choice(["m", "Qwen/Qwen3-0.6B", "m\"\\\u2028"]), "n_choices": total,
              "want_logprobs": rng.random() < 0.5, "include_usage": rng.random() < 0.5, "echo_prompts": echo,
              "n_per_prompt": n, "nvext": rng.choice([None, "none", "worker", "timing", "every"])}
    streams = [_choice_deltas(rng, i, i % n == 0) for i in range(total)]
    # Interleave the choices the way Pipeline._merge does: whatever was ready, in per-choice order.
    batches: list[list[Delta]] = []
    while any(streams):
        batch: list[Delta] = []
        for _ in range(rng.choice([1, 1, 1, 2, 4])):
            live = [s for s in streams if s]
            if not live:
                break
            batch.append(rng.choice(live).pop(0))
        batches.append(batch)
    return kwargs, batches


def _both(kwargs: dict[str, Any]) -> tuple[ChatRenderer | CompletionRenderer, LegacyRenderer]:
    mode = kwargs.pop("nvext")
    # Echo is a completions field: the chat renderer takes neither of its keys.
    only_completions = ("echo_prompts", "n_per_prompt")
    ours = {k: v for k, v in kwargs.items() if not (kwargs["chat"] and k in only_completions)}
    new = renderer_for(**ours, nvext=FakeNvext(mode) if mode else None)
    old = LegacyRenderer(**kwargs, nvext=FakeNvext(mode) if mode else None, created=new.created)
    return new, old


def _assert_same(kwargs: dict[str, Any], batches: list[list[Delta]], label: str) -> None:
    new, old = _both(dict(kwargs))
    for i, batch in enumerate(batches):
        assert new.sse(batch) == old.sse(batch), f"{label}: batch {i} of {kwargs}"
    assert new.sse_end() == old.sse_end(), label
    assert (new.prompt_tokens, new.completion_tokens, new.cached_tokens) == (
        old.prompt_tokens, old.completion_tokens, old.cached_tokens), label
    if new._nvext is not None:
        assert new._nvext.calls == old._nvext.calls, label  # type: ignore[attr-defined]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_generated_streams_render_byte_for_byte_like_the_dict_renderer(chat):
    rng = random.Random(20261201 + chat)
    for k in range(1000):
        kwargs, batches = _request(rng, chat)
        _assert_same(kwargs, batches, f"sequence {k}")


def test_fast_path_cases_by_hand():
    """The cases at the fast path's edges: a middle chunk with nvext fields, an empty finish reason
    (falsy but not None), an empty text delta after the first, two-digit indexes."""
    fixed = [
        [Delta(0, "", prompt_tokens=3, counts_prompt=True)],
        [Delta(0, "a", completion_tokens=1)], [Delta(0, "", completion_tokens=1)], [Delta(0, '"\\\n😀')],
        [Delta(0, "", finish_reason="")], [Delta(0, "x", finish_reason="")], [Delta(0, "y", stop_reason="S")],
        [Delta(0, "", finish_reason="stop", stop_reason="S")],
    ]
    for chat in (True, False):
        for usage in (True, False):
            for mode in (None, "none", "every"):
                kwargs = {"chat": chat, "request_id": "r", "model": "m", "n_choices": 1, "want_logprobs": False,
                          "include_usage": usage, "nvext": mode}
                _assert_same(kwargs, fixed, f"chat={chat} usage={usage} nvext={mode}")
    many = [[Delta(i, "t")] for i in range(12)] + [[Delta(i, "u", completion_tokens=1)] for i in range(12)]
    _assert_same({"chat": True, "request_id": "r", "model": "m", "n_choices": 12, "want_logprobs": True,
                  "include_usage": True, "nvext": None}, many, "n=12")


def test_id_model_and_created_are_read_only():
    """The chunk head is rendered once: changing them afterwards would desynchronise it, so it cannot be done."""
    r = renderer_for(chat=True, request_id="a", model="m", n_choices=1, want_logprobs=False, include_usage=True)
    assert (r.id, r.model) == ("a", "m") and r.created > 0
    with pytest.raises(AttributeError):
        r.id = "b"


def _response(rng: random.Random) -> postprocessor_pb2.GenerateResponse:
    resp = postprocessor_pb2.GenerateResponse(text=_text(rng), completion_tokens=rng.randint(0, 2),
                                              stop_reason=rng.choice(["", "END"]), worker_id=rng.choice(["", "w1"]))
    if rng.random() < 0.3:
        resp.prompt_tokens, resp.cached_tokens = rng.randint(0, 9), rng.randint(0, 9)
    if rng.random() < 0.3:
        resp.finish_reason = rng.choice([common_pb2.FINISH_REASON_EOS, common_pb2.FINISH_REASON_LENGTH,
                                         common_pb2.FINISH_REASON_TOOL_CALLS])
    if rng.random() < 0.3:
        resp.reasoning_text = _text(rng)
    if rng.random() < 0.3:
        resp.logprobs.extend(_logprobs(rng))
    if rng.random() < 0.3:
        resp.tool_calls.add(index=0, id="call_0", name="f", arguments="{")
    return resp


def test_pipeline_delta_carries_what_the_old_one_did():
    rng = random.Random(7)
    for _ in range(300):
        resp = _response(rng)
        index, counts, prompt_len = rng.randint(0, 3), rng.random() < 0.5, rng.randint(1, 99)
        new, old = Pipeline._delta(index, counts, prompt_len, resp), legacy_delta(index, counts, prompt_len, resp)
        for f in dataclasses.fields(LegacyDelta):
            a, b = getattr(new, f.name), getattr(old, f.name)
            if f.name in ("tool_calls", "logprobs"):
                assert list(a) == b and bool(a) == bool(b)
            else:
                assert a == b, f.name


def test_delta_fields_work_for_every_consumer_when_empty():
    """An empty delta's tool calls and logprobs: iterable, falsy, and something ``list.extend`` takes."""
    d = Pipeline._delta(0, False, 1, postprocessor_pb2.GenerateResponse(text="x"))
    assert not d.tool_calls and not d.logprobs
    acc: list[Any] = []
    acc.extend(d.logprobs)
    assert acc == [] and list(d.tool_calls) == []
    with pytest.raises(AttributeError):
        d.unknown = 1  # type: ignore[attr-defined]  # slots: a misspelt field fails instead of being added
