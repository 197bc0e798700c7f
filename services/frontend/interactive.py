"""``meshfront frontend -i``: a text chat on the terminal, through the frontend's own HTTP port.

It waits for a chat model to appear in discovery (``--model-name``'s, else the first listed), then reads a
line, streams the answer's tokens as they arrive (reasoning dimmed when the output is a terminal), and keeps
the conversation: each turn sends the whole history, as a chat client does. EOF (Ctrl-D) or ``/exit`` ends
it. It speaks the OpenAI API over plain HTTP, so what it exercises is exactly what any client gets; against a
gateway with ``--auth`` it sends ``OPENAI_API_KEY`` as the OpenAI SDK does.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import threading
import time
import urllib.parse
from typing import TextIO

EXIT_WORDS = ("/exit", "/quit")
MODEL_WAIT_S = 120.0


class ChatError(RuntimeError):
    """The frontend answered a turn with an error (its message is shown and the chat goes on)."""


def _headers() -> dict[str, str]:
    key = os.environ.get("OPENAI_API_KEY", "")
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}


def _connection(base_url: str, timeout: float) -> http.client.HTTPConnection:
    url = urllib.parse.urlsplit(base_url)
    if url.scheme == "https":  # our own edge, maybe with a self-signed certificate: this only chats with it
        return http.client.HTTPSConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout,
                                           context=ssl._create_unverified_context())  # noqa: S323
    return http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)


def wait_for_model(base_url: str, wanted: str | None, stop: threading.Event, timeout_s: float = MODEL_WAIT_S) -> str:
    """The chat model's name once /v1/models lists it; raises TimeoutError when none appears in time, ChatError
    when the frontend wants an API key."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            conn = _connection(base_url, 2.0)
            conn.request("GET", "/v1/models", headers=_headers())
            response = conn.getresponse()
            if response.status == 401:  # --auth: waiting longer will not help
                raise ChatError("the frontend asks for an API key (--auth): set OPENAI_API_KEY to one")
            if response.status == 200:
                ids = [m["id"] for m in json.loads(response.read())["data"]]
                chosen = wanted if wanted in ids else (ids[0] if ids and wanted is None else None)
                if chosen:
                    return chosen
            conn.close()
        except (OSError, ValueError, KeyError):
            pass  # Envoy or the gateway is still starting
        stop.wait(0.5)
    raise TimeoutError(f"no model {wanted or ''} registered within {timeout_s:.0f} s".replace("  ", " "))


def stream_turn(base_url: str, model: str, messages: list[dict], out: TextIO, dim: bool) -> str:
    """Sends the conversation, writes the answer's deltas as they stream, returns the answer's content."""
    conn = _connection(base_url, 300.0)
    body = json.dumps({"model": model, "messages": messages, "stream": True})
    conn.request("POST", "/v1/chat/completions", body, _headers())
    response = conn.getresponse()
    if response.status != 200:
        detail = json.loads(response.read() or b"{}").get("error", {}).get("message", response.reason)
        raise ChatError(f"{response.status}: {detail}")
    content: list[str] = []
    reasoning = False
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        if "error" in chunk:
            raise ChatError(chunk["error"].get("message", "the stream failed"))
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                if dim and not reasoning:
                    out.write("\033[2m")
                reasoning = True
                out.write(thought)
            text = delta.get("content")
            if text:
                if reasoning and dim:
                    out.write("\033[0m\n")
                reasoning = False
                content.append(text)
                out.write(text)
            out.flush()
    if reasoning and dim:
        out.write("\033[0m")
    out.write("\n")
    out.flush()
    return "".join(content)


def chat(base_url: str, model: str | None, stdin: TextIO, out: TextIO, stop: threading.Event, note: str = "") -> int:
    """The chat loop; 0 when the user ends it, 1 when no model appeared."""
    out.write(f"waiting for a chat model at {base_url} ... {note}\n")
    out.flush()
    try:
        chosen = wait_for_model(base_url, model, stop)
    except (TimeoutError, ChatError) as e:
        out.write(f"{e}\n")
        return 1
    dim = out.isatty()
    out.write(f"chatting with {chosen}; {' or '.join(EXIT_WORDS)} or Ctrl-D ends\n")
    messages: list[dict] = []
    while not stop.is_set():
        out.write("> ")
        out.flush()
        line = stdin.readline()
        if not line or line.strip() in EXIT_WORDS:
            out.write("\n")
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        try:
            answer = stream_turn(base_url, chosen, messages, out, dim)
        except (ChatError, OSError, ValueError) as e:
            messages.pop()  # the turn failed: it is not part of the conversation
            out.write(f"[error] {e}\n")
            continue
        messages.append({"role": "assistant", "content": answer})
    return 0
