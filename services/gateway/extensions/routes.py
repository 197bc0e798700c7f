"""The route extension contract: ``Route`` (a method, a static path, a handler), what a handler receives
(``RouteRequest``, with ``FrontendState``) and may return (a JSON value, or ``Response``).

Dynamo's ``FrontendRoute`` (1.6.1) takes static-path GET routes whose synchronous handler gets a read-only view
of the frontend and returns a JSON body or ``FrontendResponse(status, body)``. Ours keeps that shape and adds
POST (the handler gets the JSON body), async handlers (awaited on the gateway's loop) and raising
``ExtensionError`` for an OpenAI-shaped error. A synchronous handler runs in a worker thread, so a slow one
never stalls the gateway's other requests. Paths follow Dynamo's rules: they start with ``/``, are static (no
``{...}``, ``*``, whitespace, and no segment starting with ``:``), and may not shadow a built-in route.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import orjson

METHODS = ("GET", "POST")
JSON = "application/json"
# RFC 3986 path characters without percent-escapes (a static path is matched exactly by Envoy).
_PATH_CHARS = re.compile(r"/[A-Za-z0-9._~!$&'()+,;=:@/-]*")
MAX_PATH = 512


class FrontendState(Protocol):
    """A read-only, live view of the gateway for route handlers (Dynamo's ``FrontendExtensionContext``)."""

    def is_ready(self) -> bool:
        """The gateway has warmed its first workers up and is not draining."""
        ...

    def is_draining(self) -> bool:
        """The gateway is shutting down (Dynamo's ``is_cancelled``)."""
        ...

    def model_names(self) -> list[str]:
        """Sorted names of the models with at least one live worker (LoRA adapters included)."""
        ...

    def is_model_ready(self, name: str) -> bool:
        """``name`` has at least one live worker."""
        ...


@dataclasses.dataclass(frozen=True)
class RouteRequest:
    """One call of an extension route."""

    method: str
    path: str
    # The client's x-request-id (or the one Envoy made up): every response echoes it, and it finds the trace.
    request_id: str
    headers: Mapping[str, str]
    # POST: the body parsed as JSON (None when empty); GET: None.
    json: Any
    state: FrontendState


@dataclasses.dataclass(frozen=True)
class Response:
    """A handler's answer with a status other than 200, or a body that is not JSON.

    ``body``: bytes or str go out as they are, with ``content_type``; any other value is JSON. An error status
    (400-599) answers a JSON body (its content type must be JSON): it travels to Envoy in a trailer, as every
    error of the gateway does.
    """

    status_code: int
    body: Any = None
    content_type: str = JSON

    def __post_init__(self) -> None:
        if self.status_code != 200 and not (isinstance(self.status_code, int) and 400 <= self.status_code <= 599):
            raise ValueError(f"Response status must be 200 or an error (400-599); got {self.status_code!r}")
        if self.status_code >= 400 and (not self.content_type.startswith(JSON) or isinstance(self.body, bytes)):
            raise ValueError("an error Response answers a JSON value (content type application/json)")

    def encoded(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str) and not self.content_type.startswith(JSON):
            return self.body.encode()
        return orjson.dumps(self.body)


Handler = Callable[[RouteRequest], Any | Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class Route:
    """One extension route: ``method`` (GET or POST), a static ``path``, and its ``handler``. Checked here, as
    Dynamo checks a ``FrontendRoute`` when it is made: a bad route fails the gateway's start."""

    method: str
    path: str
    handler: Handler

    def __post_init__(self) -> None:
        method = self.method.upper() if isinstance(self.method, str) else self.method
        if method not in METHODS:
            raise ValueError(f"route method {self.method!r} is not one of {', '.join(METHODS)}")
        object.__setattr__(self, "method", method)
        check_path(self.path)
        if not callable(self.handler):
            raise TypeError(f"the handler of {method} {self.path} is not callable")


def check_path(path: Any) -> None:
    """Dynamo's rules for a route path, and characters Envoy matches as they are."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"route path must start with '/': {path!r}")
    if len(path) > MAX_PATH:
        raise ValueError(f"route path is longer than {MAX_PATH} characters: {path[:40]!r}...")
    if not _PATH_CHARS.fullmatch(path):
        raise ValueError(f"route path must be static (letters, digits and -._~!$&'()+,;=:@/; no '{{...}}', '*', "
                         f"'%', '?' or whitespace): {path!r}")
    segments = path.split("/")[1:]
    if any(s.startswith(":") for s in segments):
        raise ValueError(f"route path segment must not start with ':': {path!r}")
    if any(s in (".", "..") for s in segments) or "//" in path:
        raise ValueError(f"route path must be normalized (no '.', '..' or empty segments): {path!r}")
