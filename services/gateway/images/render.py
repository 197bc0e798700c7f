"""The Images API's answers, written as the worker's events arrive.

- ``b64_json``: one JSON body, ``{"created", "data": [{"b64_json"}...], "size", "output_format", "quality",
  "background", "usage"}``, written piece by piece: each worker chunk (<= 1 MiB) goes out base64-encoded as
  it comes (the few bytes that do not fill a base64 quantum wait for the next chunk), and ``usage``, which
  the worker reports last, closes the body. Nothing is written before the first chunk, so every failure
  before it still gets a real HTTP status.
- ``url``: each output goes into the media store as it streams; the body (the URLs) follows the last.
- streamed (``stream: true``): a ``<prefix>.partial_image`` event per preview as it comes, then one
  ``<prefix>.completed`` event per image, which carries the request's usage: they follow the worker's
  ``done``, so each image's bytes are held until then (an image, never a video).

``prefix`` is ``image_generation`` for generations and ``image_edit`` for edits, as OpenAI names them.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from meshfront.worker.v1 import media_pb2

from services.common.errors import MeshError, WorkerFailed
from services.gateway.core.errors import error_body
from services.gateway.images.request import ImageRequest
from services.gateway.media.base64_stream import Base64Stream

MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
Events = AsyncIterator[media_pb2.GenerateMediaResponse]
# Stores one output's bytes and returns its URL.
Store = Callable[[AsyncIterator[bytes], str], Awaitable[str]]



class ImagesAnswer:
    """One request's answer; ``usage`` and the token counts are known once the worker's ``done`` came."""

    def __init__(self, req: ImageRequest, width: int, height: int, *, edit: bool):
        self.req = req
        self.size = f"{width}x{height}"
        self.prefix = "image_edit" if edit else "image_generation"
        self.created = int(time.time())
        self.input_tokens = 0
        self.output_tokens = 0

    def _done(self, done: media_pb2.MediaDone) -> None:
        self.input_tokens, self.output_tokens = done.input_tokens, done.output_tokens

    def usage(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens,
                "input_tokens_details": {"text_tokens": self.input_tokens, "image_tokens": 0},
                "output_tokens_details": {"image_tokens": self.output_tokens, "text_tokens": 0}}

    def _settings(self) -> dict[str, Any]:
        return {"size": self.size, "output_format": self.req.output_format, "quality": self.req.quality,
                "background": self.req.background}

    def _tail(self) -> bytes:
        """What follows ``data``: the settings the images were made with, and the usage."""
        return orjson.dumps({**self._settings(), "usage": self.usage()})[1:]

    def _check_outputs(self, outputs: int) -> None:
        if outputs != self.req.n:
            raise WorkerFailed(f"the media worker returned {outputs} of {self.req.n} images")

    async def b64_body(self, events: Events) -> AsyncGenerator[bytes, None]:
        index = -1
        encoder = Base64Stream()
        async for event in events:
            kind = event.WhichOneof("event")
            if kind == "chunk":
                chunk = event.chunk
                piece = b""
                if chunk.index != index:  # the next output begins
                    if chunk.index != index + 1:
                        raise WorkerFailed("the media worker sent its outputs out of order")
                    piece = (b'{"created":%d,"data":[{"b64_json":"' % self.created if index < 0
                             else b'},{"b64_json":"')
                    index = chunk.index
                piece += encoder.feed(chunk.data)
                if chunk.last:
                    piece += encoder.end() + b'"'
                if piece:
                    yield piece
            elif kind == "done":
                self._done(event.done)
        self._check_outputs(index + 1)
        yield b"}]," + self._tail()

    async def url_body(self, events: Events, store: Store) -> AsyncGenerator[bytes, None]:
        urls: list[str] = []
        stream = aiter(events)
        async for event in stream:
            kind = event.WhichOneof("event")
            if kind == "chunk":
                if event.chunk.index != len(urls):
                    raise WorkerFailed("the media worker sent its outputs out of order")
                urls.append(await store(_one_output(event.chunk, stream), MIME[self.req.output_format]))
            elif kind == "done":
                self._done(event.done)
        self._check_outputs(len(urls))
        yield orjson.dumps({"created": self.created, "data": [{"url": u} for u in urls], **self._settings(),
                            "usage": self.usage()})

    def _event(self, kind: str, b64: bytes, extra: dict[str, Any]) -> bytes:
        body = {"type": f"{self.prefix}.{kind}", "created_at": int(time.time()), **self._settings(), **extra}
        # The image goes in as bytes already encoded: no decode into a Python str and back.
        return (b"event: %s.%s\ndata: {\"b64_json\":\"%s\"," % (self.prefix.encode(), kind.encode(), b64)
                + orjson.dumps(body)[1:] + b"\n\n")

    async def sse(self, events: Events) -> AsyncGenerator[bytes, None]:
        images: list[bytearray] = []
        async for event in events:
            kind = event.WhichOneof("event")
            if kind == "partial":
                yield self._event("partial_image", base64.b64encode(event.partial.data),
                                  {"partial_image_index": event.partial.partial_index})
            elif kind == "chunk":
                if event.chunk.index == len(images):
                    images.append(bytearray())
                elif event.chunk.index != len(images) - 1:
                    raise WorkerFailed("the media worker sent its outputs out of order")
                images[-1] += event.chunk.data
            elif kind == "done":
                self._done(event.done)
        self._check_outputs(len(images))
        for image in images:
            yield self._event("completed", base64.b64encode(image), {"usage": self.usage()})

    @staticmethod
    def sse_error(err: MeshError) -> bytes:
        """A failure after the first event: the status is sent, so it travels in-band (the SDK raises it)."""
        return b"event: error\ndata: " + error_body(err) + b"\n\n"


async def _one_output(first: media_pb2.MediaChunk, stream: Events) -> AsyncIterator[bytes]:
    """One output's bytes: ``first``, then the stream's chunks up to that output's ``last``."""
    chunk = first
    while True:
        yield chunk.data
        if chunk.last:
            return
        event = await anext(stream, None)
        if event is None or event.WhichOneof("event") != "chunk" or event.chunk.index != first.index:
            raise WorkerFailed("the media worker ended an output early")
        chunk = event.chunk
