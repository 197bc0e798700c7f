"""OpenAI response shapes for /v1/chat/completions (``ChatRenderer``) and /v1/completions
(``CompletionRenderer``): streamed chunks, folded non-stream bodies, usage, logprobs.

Inputs are ``Delta`` records (one choice's new output); a renderer keeps the per-request state (first
chunk carries the role, usage totals, folded text). Both share the pre-rendered chunk templates and the
fast path in ``_ChunkRenderer``; each says only how its choice looks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from services.common.errors import MeshError
from services.gateway.core.delta import Delta, fold_tool_calls, joined_tool_calls, tool_call_chunk
from services.gateway.core.errors import sse_error_frame


@dataclasses.dataclass
class _ChoiceOutput:
    text: list[str] = dataclasses.field(default_factory=list)
    reasoning: list[str] = dataclasses.field(default_factory=list)
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    logprobs: list[Any] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str = ""
    started: bool = False


def _chat_logprobs(items: Sequence[Any]) -> dict[str, Any]:
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
                         "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": list(a.token.encode())}
                                          for a in t.top]} for t in items]}


def _message(text: str, c: _ChoiceOutput, reasoning_field: str) -> dict[str, Any]:
    """The non-stream assistant message: content is null when the reply is only tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not c.tool_calls else None}
    if c.reasoning:
        message[reasoning_field] = "".join(c.reasoning)
    if c.tool_calls:
        message["tool_calls"] = joined_tool_calls(c.tool_calls)
    return message


def _completion_logprobs(items: Sequence[Any], offset: int) -> dict[str, Any]:
    offsets, pos = [], offset
    for t in items:
        offsets.append(pos)
        pos += len(t.token)
    return {"tokens": [t.token for t in items], "token_logprobs": [t.logprob for t in items],
            "top_logprobs": [{a.token: a.logprob for a in t.top} for t in items], "text_offset": offsets}


class NvextFields(Protocol):
    """The response ``nvext`` a request asked for (openai/extensions.py)."""

    def chunk_nvext(self, index: int, first: bool, final: bool) -> dict[str, Any] | None: ...

    def body_nvext(self) -> dict[str, Any] | None: ...


class _ChunkRenderer:
    """Turns deltas into SSE frames or one folded body; a subclass renders its endpoint's choice.

    Every chunk of a stream shares its head (id, object, created, model) and its tail (usage), so they
    are rendered once per request, as bytes, and a chunk only renders its choice in between. A started
    choice's plain text delta (nearly every token) skips the dict altogether: its frame is byte
    templates around ``orjson.dumps(text)``, the bytes orjson writes for the dict, since its output is
    compact and the same for a value wherever it sits. tests/unit/gateway/test_render_fast_path.py holds
    it to the dict renderer byte for byte.
    """

    _object: str  # the chunk's "object"
    _body_object: str  # the folded body's "object"
    _text_key: bytes  # the fast path's frame up to the text: a choice's text field
    _text_close: bytes  # what closes the text's field before logprobs

    def __init__(self, *, request_id: str, model: str, n_choices: int, want_logprobs: bool,
                 include_usage: bool, nvext: NvextFields | None = None):
        self._id = request_id
        self._model = model
        self._created = int(time.time())
        self.want_logprobs = want_logprobs
        self.include_usage = include_usage  # fixed at construction: the templates depend on it
        self.choices = [_ChoiceOutput() for _ in range(n_choices)]
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self._echo: list[str] | None = None
        self._n_per_prompt = 1
        self._text_len = [0] * n_choices
        self._nvext = nvext
        self._render_templates()

    # Fixed once the templates are rendered: every chunk's pre-rendered head carries them.
    id = property(lambda self: self._id)
    model = property(lambda self: self._model)
    created = property(lambda self: self._created)

    def _render_templates(self) -> None:
        head = orjson.dumps({"id": self._id, "object": self._object, "created": self._created, "model": self._model,
                             "choices": []})
        # "choices" is the last key: the head runs up to its opening bracket, then come a chunk's choice and tail.
        self._head = b"data: " + head[:-2]
        self._close = b'],"usage":null' if self.include_usage else b"]"
        self._tail = self._close + b"}\n\n"
        # The fast path's frame, for a started choice's text without logprobs, finish reason or nvext fields.
        self._text_heads = [self._head + b'{"index":' + orjson.dumps(i) + self._text_key
                            for i in range(len(self.choices))]
        self._text_tail = self._text_close + b',"logprobs":null,"finish_reason":null}' + self._tail

    def _account(self, d: Delta) -> None:
        self.completion_tokens += d.completion_tokens
        if d.counts_prompt:
            self.prompt_tokens += d.prompt_tokens
            self.cached_tokens += d.cached_tokens

    def _chunk_choice(self, d: Delta) -> dict[str, Any]:
        raise NotImplementedError

    def _body_choice(self, index: int, text: str, c: _ChoiceOutput) -> dict[str, Any]:
        raise NotImplementedError

    def sse(self, deltas: list[Delta]) -> bytes:
        """All ready deltas in one buffer: one SSE frame each, to be sent as one HttpBody."""
        frames = []
        nvext = self._nvext
        for d in deltas:
            self._account(d)
            i = d.index
            c = self.choices[i]
            ext: dict[str, Any] | None
            if c.started and d.finish_reason is None and not (d.logprobs or d.reasoning or d.tool_calls):
                text = d.text
                if not text:
                    continue  # nothing to send
                ext = nvext.chunk_nvext(i, False, False) if nvext else None
                if not ext:
                    self._text_len[i] += len(text)
                    frames.append(self._text_heads[i] + orjson.dumps(text) + self._text_tail)
                    continue
            elif (not d.text and not d.finish_reason and not d.logprobs and not d.reasoning and not d.tool_calls
                    and c.started):
                continue  # nothing new either: an empty finish reason ("" is not None) with nothing else
            else:
                ext = nvext.chunk_nvext(i, not c.started, d.finish_reason is not None) if nvext else None
            frames.append(self._frame(d, ext))
        return b"".join(frames)

    def _frame(self, d: Delta, ext: dict[str, Any] | None) -> bytes:
        """A chunk through the dict: its choice, and the nvext fields after usage, inside the pre-rendered parts."""
        choice = self._chunk_choice(d)
        choice["finish_reason"] = d.finish_reason
        if d.finish_reason and d.stop_reason:
            choice["stop_reason"] = d.stop_reason
        data = orjson.dumps(choice)
        if ext:
            return self._head + data + self._close + b',"nvext":' + orjson.dumps(ext) + b"}\n\n"
        return self._head + data + self._tail

    def usage(self) -> dict[str, Any]:
        u: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                             "total_tokens": self.prompt_tokens + self.completion_tokens}
        u["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return u

    def sse_end(self) -> bytes:
        tail = b""
        if self.include_usage:
            chunk = {"id": self.id, "object": self._object, "created": self.created, "model": self.model,
                     "choices": [], "usage": self.usage()}
            tail = b"data: " + orjson.dumps(chunk) + b"\n\n"
        return tail + b"data: [DONE]\n\n"

    def sse_error(self, err: MeshError) -> bytes:
        return sse_error_frame(err)

    def fold(self, deltas: list[Delta]) -> None:
        for d in deltas:
            self._account(d)
            c = self.choices[d.index]
            if not c.started and self._echo is not None:
                c.text.append(self._echo[d.index // self._n_per_prompt])
            c.started = True
            c.text.append(d.text)
            if d.reasoning:
                c.reasoning.append(d.reasoning)
            fold_tool_calls(c.tool_calls, d.tool_calls)
            c.logprobs.extend(d.logprobs)
            if d.finish_reason:
                c.finish_reason, c.stop_reason = d.finish_reason, d.stop_reason

    def body(self) -> bytes:
        choices = []
        for i, c in enumerate(self.choices):
            out = self._body_choice(i, "".join(c.text), c)
            out["finish_reason"] = c.finish_reason
            if c.stop_reason:
                out["stop_reason"] = c.stop_reason
            choices.append(out)
        body: dict[str, Any] = {"id": self.id, "object": self._body_object, "created": self.created,
                                "model": self.model, "choices": choices, "usage": self.usage()}
        ext = self._nvext.body_nvext() if self._nvext else None
        if ext:
            body["nvext"] = ext
        return orjson.dumps(body)


class ChatRenderer(_ChunkRenderer):
    """/v1/chat/completions: chunks carry a ``delta`` (role first, then content, reasoning, tool calls).

    ``reasoning_field`` names the field reasoning travels in (the gateway's ``--reasoning-field-name``):
    only chunks and bodies that carry reasoning read it, so the text fast path is the same either way.
    """

    _object = "chat.completion.chunk"
    _body_object = "chat.completion"
    _text_key = b',"delta":{"content":'
    _text_close = b"}"

    def __init__(self, *, reasoning_field: str = "reasoning_content", **kwargs: Any):
        super().__init__(**kwargs)
        self.reasoning_field = reasoning_field

    def _chunk_choice(self, d: Delta) -> dict[str, Any]:
        choice = self.choices[d.index]
        text = d.text
        delta: dict[str, Any] = {}
        if not choice.started:
            delta["role"] = "assistant"
        if text or not choice.started:
            delta["content"] = text
        if d.reasoning:
            delta[self.reasoning_field] = d.reasoning
        if d.tool_calls:
            delta["tool_calls"] = [tool_call_chunk(c) for c in d.tool_calls]
        choice.started = True
        self._text_len[d.index] += len(text)
        return {"index": d.index, "delta": delta,
                "logprobs": _chat_logprobs(d.logprobs) if self.want_logprobs and d.logprobs else None}

    def _body_choice(self, index: int, text: str, c: _ChoiceOutput) -> dict[str, Any]:
        return {"index": index, "message": _message(text, c, self.reasoning_field),
                "logprobs": _chat_logprobs(c.logprobs) if self.want_logprobs else None}


class CompletionRenderer(_ChunkRenderer):
    """/v1/completions: chunks carry ``text``; ``echo`` puts each prompt before its choices' text."""

    _object = "text_completion"
    _body_object = "text_completion"
    _text_key = b',"text":'
    _text_close = b""

    def __init__(self, *, echo_prompts: list[str] | None = None, n_per_prompt: int = 1, **kwargs: Any):
        super().__init__(**kwargs)
        self._echo = echo_prompts
        self._n_per_prompt = n_per_prompt

    def _chunk_choice(self, d: Delta) -> dict[str, Any]:
        choice = self.choices[d.index]
        text = d.text
        if not choice.started and self._echo is not None:
            text = self._echo[d.index // self._n_per_prompt] + text
        want = self.want_logprobs and d.logprobs
        lp = _completion_logprobs(d.logprobs, self._text_len[d.index]) if want else None
        choice.started = True
        self._text_len[d.index] += len(text)
        return {"index": d.index, "text": text, "logprobs": lp}

    def _body_choice(self, index: int, text: str, c: _ChoiceOutput) -> dict[str, Any]:
        return {"index": index, "text": text,
                "logprobs": _completion_logprobs(c.logprobs, 0) if self.want_logprobs else None}


def renderer_for(*, chat: bool, **kwargs: Any) -> ChatRenderer | CompletionRenderer:
    """The renderer of /v1/chat/completions (``chat``) or /v1/completions, built with ``kwargs``."""
    return ChatRenderer(**kwargs) if chat else CompletionRenderer(**kwargs)
