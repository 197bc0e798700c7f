"""What extension code may do to a chat request and its answer, and the error it raises to refuse one.

The chat engine factory (``--chat-engine-factory``; services/gateway/extensions/engine_factory.py) gives each
chat model a ``ChatHooks``: ``pre`` sees the request body (a dict, before the gateway parses it) and returns
the body to serve, or raises ``ExtensionError`` to refuse it; ``post`` sees every chunk of the answer (each
``chat.completion.chunk`` of a stream, the usage chunk included, or the whole ``chat.completion``) and
returns the chunk to send. A model without hooks is served as if no factory were set: the renderer's
pre-rendered bytes go out untouched, and nothing here runs per token.

This module is the shared layer's part (the openai front end applies the hooks); loading extension code is
services/gateway/extensions/.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import orjson

from services.common.errors import MeshError
from services.gateway.core.delta import Delta
from services.gateway.core.request import load_json

# OpenAI's error ``type`` for the statuses an extension is likely to answer; others by class (4xx, 5xx).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 500: "internal_server_error",
          501: "not_implemented", 503: "service_unavailable", 504: "timeout"}
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.ABORTED,
          429: grpc.StatusCode.RESOURCE_EXHAUSTED, 501: grpc.StatusCode.UNIMPLEMENTED,
          503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


class ExtensionError(MeshError):
    """Extension code refuses a request: an HTTP status (400-599) and OpenAI's error body around ``message``.

    Raised by a route handler or a chat pre-hook (or post-hook), it answers like any error of the gateway's
    own: the status and ``{"error": {"message", "type", "param", "code"}}``, counted in /metrics under its
    reason (NOT_FOUND for a 404, INVALID_REQUEST for another 4xx, OVERLOADED for 429 and 503, INTERNAL).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        if not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"ExtensionError takes an HTTP error status (400-599); got {status!r}")
        super().__init__(message, param=param, code=code)
        self.http_status = status
        self.openai_type = type or _TYPES.get(status, "invalid_request_error" if status < 500
                                              else "internal_server_error")
        self.grpc_code = _CODES.get(status, grpc.StatusCode.FAILED_PRECONDITION if status < 500
                                    else grpc.StatusCode.INTERNAL)
        self.reason = ("NOT_FOUND" if status == 404 else "OVERLOADED" if status in (429, 503)
                       else "INVALID_REQUEST" if status < 500 else "INTERNAL")
        # A route's own error body (``Response`` with an error status), sent instead of OpenAI's.
        self.body: bytes | None = None


Body = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ChatHooks:
    """One chat model's hooks. ``pre(body) -> body`` may be a coroutine function; ``post(chunk) -> chunk``
    runs for every chunk, so it must be a plain function (checked here, when the factory returns it)."""

    pre: Callable[[Body], Body | Awaitable[Body]] | None = None
    post: Callable[[Body], Body] | None = None

    def __post_init__(self) -> None:
        for name in ("pre", "post"):
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise TypeError(f"ChatHooks.{name} must be callable; got {hook!r}")
        if self.post is not None and inspect.iscoroutinefunction(self.post):
            raise TypeError("ChatHooks.post must be a plain function: it runs for every chunk of the answer")


# A model's hooks (None: it has none); awaited once per chat request, only when a factory is set.
HookLookup = Callable[[str], Awaitable[ChatHooks | None]]


async def hooked_body(raw: bytes, lookup: HookLookup) -> tuple[bytes, ChatHooks | None]:
    """The body to parse and the model's hooks: ``raw`` as it is when the model has no pre-hook, else what
    the pre-hook made of it (a non-object body is refused here as the parser would refuse it)."""
    body = load_json(raw)
    model = body.get("model")
    hooks = await lookup(model) if isinstance(model, str) else None
    if hooks is None or hooks.pre is None:
        return raw, hooks
    changed = hooks.pre(body)
    if inspect.isawaitable(changed):
        changed = await changed
    if not isinstance(changed, dict):
        raise TypeError(f"the chat pre-hook returned {type(changed).__name__}; it must return the request body")
    return orjson.dumps(changed), hooks


class HookedRenderer:
    """A chat renderer whose every chunk goes through ``post``: its SSE frames are parsed back, handed to
    the hook and rendered again (only for a model with a post-hook; an error frame and ``[DONE]`` pass as
    they are)."""

    def __init__(self, inner: Any, post: Callable[[Body], Body]):
        self._inner = inner
        self._post = post

    @property
    def prompt_tokens(self) -> int:
        return self._inner.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self._inner.completion_tokens

    @property
    def cached_tokens(self) -> int:
        return self._inner.cached_tokens

    def _chunk(self, chunk: Body) -> bytes:
        out = self._post(chunk)
        if not isinstance(out, dict):
            raise TypeError(f"the chat post-hook returned {type(out).__name__}; it must return the chunk")
        return orjson.dumps(out)

    def _frames(self, data: bytes) -> bytes:
        # orjson escapes newlines inside strings, so a blank line only ever ends a frame.
        frames = []
        for frame in data.split(b"\n\n"):
            if frame.startswith(b"data: {") and not frame.startswith(b'data: {"error"'):
                frame = b"data: " + self._chunk(orjson.loads(frame[6:]))
            frames.append(frame)
        return b"\n\n".join(frames)

    def fold(self, deltas: list[Delta]) -> None:
        self._inner.fold(deltas)

    def body(self) -> bytes:
        return self._chunk(orjson.loads(self._inner.body()))

    def sse(self, deltas: list[Delta]) -> bytes:
        return self._frames(self._inner.sse(deltas))

    def sse_end(self) -> bytes:
        return self._frames(self._inner.sse_end())

    def sse_error(self, err: MeshError) -> Any:
        return self._inner.sse_error(err)

    def usage(self) -> Any:
        return self._inner.usage()


def with_post_hook(renderer: Any, hooks: ChatHooks | None) -> Any:
    """``renderer``, or it wrapped so that every chunk goes through the model's post-hook."""
    return HookedRenderer(renderer, hooks.post) if hooks is not None and hooks.post is not None else renderer
