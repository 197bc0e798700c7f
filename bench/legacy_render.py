"""The gateway's chunk rendering and proto-to-delta code as they were before the byte-template fast path,
frozen: the "before" side of ``python -m bench.render`` and the oracle of
tests/unit/gateway/test_render_fast_path.py (every chunk, the usage chunk, the nvext calls and the usage totals
of the product's renderers must come out the same for any delta sequence). The product carries no old code,
so the copy lives with the benchmark that measures against it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import orjson
from meshfront.postprocessor.v1 import postprocessor_pb2

from services.gateway.core.delta import FINISH

# ---- frozen copy of the pre-fast-path code: do not edit ------------------------------------------------------------

@dataclasses.dataclass
class LegacyDelta:
    index: int
    text: str = ""
    reasoning: str = ""
    tool_calls: list[Any] = dataclasses.field(default_factory=list)
    logprobs: list[Any] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str = ""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    counts_prompt: bool = False
    worker_id: str = ""


def legacy_delta(index: int, counts_prompt: bool, prompt_len: int,
                 resp: postprocessor_pb2.GenerateResponse) -> LegacyDelta:
    first = resp.prompt_tokens > 0
    return LegacyDelta(index=index, text=resp.text, reasoning=resp.reasoning_text, tool_calls=list(resp.tool_calls),
                       logprobs=list(resp.logprobs),
                       finish_reason=FINISH.get(resp.finish_reason), stop_reason=resp.stop_reason,
                       completion_tokens=resp.completion_tokens,
                       prompt_tokens=(resp.prompt_tokens or prompt_len) if first else 0,
                       cached_tokens=resp.cached_tokens if first else 0, counts_prompt=counts_prompt and first,
                       worker_id=resp.worker_id)


def _chat_logprobs(items: list[Any]) -> dict[str, Any]:
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
                         "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": list(a.token.encode())}
                                          for a in t.top]} for t in items]}


def _tool_call_delta(call: Any) -> dict[str, Any]:
    if call.name:
        return {"index": call.index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}
    return {"index": call.index, "function": {"arguments": call.arguments}}


def _completion_logprobs(items: list[Any], offset: int) -> dict[str, Any]:
    offsets, pos = [], offset
    for t in items:
        offsets.append(pos)
        pos += len(t.token)
    return {"tokens": [t.token for t in items], "token_logprobs": [t.logprob for t in items],
            "top_logprobs": [{a.token: a.logprob for a in t.top} for t in items], "text_offset": offsets}


class LegacyRenderer:
    def __init__(self, *, chat: bool, request_id: str, model: str, n_choices: int, want_logprobs: bool,
                 include_usage: bool, echo_prompts: list[str] | None = None, n_per_prompt: int = 1,
                 nvext: Any = None, created: int | None = None):
        self.chat = chat
        self.id = request_id
        self.model = model
        self.created = int(time.time()) if created is None else created
        self.want_logprobs = want_logprobs
        self.include_usage = include_usage
        self.started = [False] * n_choices
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self._echo = echo_prompts
        self._n_per_prompt = n_per_prompt
        self._text_len = [0] * n_choices
        self._object = "chat.completion.chunk" if chat else "text_completion"
        self._nvext = nvext

    def _account(self, d: Any) -> None:
        self.completion_tokens += d.completion_tokens
        if d.counts_prompt:
            self.prompt_tokens += d.prompt_tokens
            self.cached_tokens += d.cached_tokens

    def _chunk_choice(self, d: Any) -> dict[str, Any]:
        started = self.started[d.index]
        text = d.text
        if not started and self._echo is not None:
            text = self._echo[d.index // self._n_per_prompt] + text
        if self.chat:
            delta: dict[str, Any] = {}
            if not started:
                delta["role"] = "assistant"
            if text or not started:
                delta["content"] = text
            if d.reasoning:
                delta["reasoning_content"] = d.reasoning
            if d.tool_calls:
                delta["tool_calls"] = [_tool_call_delta(c) for c in d.tool_calls]
            out: dict[str, Any] = {"index": d.index, "delta": delta}
            lp = _chat_logprobs(d.logprobs) if self.want_logprobs and d.logprobs else None
        else:
            out = {"index": d.index, "text": text}
            want = self.want_logprobs and d.logprobs
            lp = _completion_logprobs(d.logprobs, self._text_len[d.index]) if want else None
        self.started[d.index] = True
        self._text_len[d.index] += len(text)
        out["logprobs"] = lp
        out["finish_reason"] = d.finish_reason
        if d.finish_reason and d.stop_reason:
            out["stop_reason"] = d.stop_reason
        return out

    def sse(self, deltas: list[Any]) -> bytes:
        frames = []
        for d in deltas:
            self._account(d)
            if (not d.text and not d.finish_reason and not d.logprobs and not d.reasoning and not d.tool_calls
                    and self.started[d.index]):
                continue
            first = not self.started[d.index]
            chunk = {"id": self.id, "object": self._object, "created": self.created, "model": self.model,
                     "choices": [self._chunk_choice(d)]}
            if self.include_usage:
                chunk["usage"] = None
            ext = self._nvext.chunk_nvext(d.index, first, d.finish_reason is not None) if self._nvext else None
            if ext:
                chunk["nvext"] = ext
            frames.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
        return b"".join(frames)

    def sse_end(self) -> bytes:
        tail = b""
        if self.include_usage:
            usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                     "total_tokens": self.prompt_tokens + self.completion_tokens,
                     "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
            chunk = {"id": self.id, "object": self._object, "created": self.created, "model": self.model,
                     "choices": [], "usage": usage}
            tail = b"data: " + orjson.dumps(chunk) + b"\n\n"
        return tail + b"data: [DONE]\n\n"

# ---- end of the frozen copy ------------------------------------------------------------------------------------------
