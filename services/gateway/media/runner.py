"""A media generation as its callers see it: the runner (route, call the worker, release), the store
its outputs go to, and one video's event stream read as it comes.

``VideoRun`` wraps the pipeline's events (progress, then the video's chunks, then done) so that a
caller takes them in order without ever holding more than one chunk: ``progress()`` yields the
denoising progress until the first chunk arrives, ``chunks()`` then yields the video's bytes, and
``done`` holds the worker's closing report. The spine's pieces are named by what they do here
(``MediaRunner``, ``MediaBlobs``) so a caller (the Videos API, KServe's media models) needs no more of them
than it uses.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from meshfront.worker.v1 import media_pb2

from services.common.errors import WorkerFailed

# As the media worker encodes them (services/workers/media/encode.py): MJPEG frames travel in an AVI.
CONTENT_TYPES = {"mp4": "video/mp4", "mjpeg": "video/x-msvideo"}


class MediaRunner(Protocol):
    """services/gateway/media/pipeline.py ``MediaPipeline``: route, call the worker, release."""

    def run(self, req: media_pb2.GenerateMediaRequest) -> AsyncIterator[media_pb2.GenerateMediaResponse]: ...


class MediaBlobs(Protocol):
    """services/gateway/media/store.py ``MediaStore``: generated media in NATS's object store, with a TTL."""

    async def put(self, chunks: AsyncIterator[bytes], content_type: str, ttl_s: int | None = None) -> str: ...

    async def open(self, media_id: str) -> tuple[str, int, AsyncGenerator[bytes, None]]: ...

    async def delete(self, media_id: str) -> bool: ...


async def close_events(events: AsyncIterator[media_pb2.GenerateMediaResponse]) -> None:
    """Closes a generation left early, which cancels the worker's call (MediaPipeline.run is a generator)."""
    if isinstance(events, AsyncGenerator):
        await events.aclose()


class VideoRun:
    """The events of one generation, in the order the worker sends them."""

    def __init__(self, events: AsyncIterator[media_pb2.GenerateMediaResponse]):
        self._events = events
        self._first: media_pb2.MediaChunk | None = None
        self.done: media_pb2.MediaDone | None = None

    async def progress(self) -> AsyncIterator[tuple[int, int]]:
        """(step, total_steps) per progress event, until the video's first chunk (kept for ``chunks``)."""
        async for ev in self._events:
            kind = ev.WhichOneof("event")
            if kind == "progress":
                yield ev.progress.step, ev.progress.total_steps
            elif kind == "chunk":
                self._first = ev.chunk
                return
            elif kind == "done":
                raise WorkerFailed("the video worker finished without sending a video")
            # a partial (preview) is for images; a video request asks for none
        raise WorkerFailed("the video worker ended its stream before sending a video")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The video's bytes chunk by chunk, then reads on to the worker's ``done``."""
        chunk = self._first
        if chunk is None:
            async for _ in self.progress():
                pass
            chunk = self._first
        assert chunk is not None  # progress() returns only once it has the first chunk
        while True:
            yield chunk.data
            if chunk.last:
                break
            ev = await anext(self._events, None)
            if ev is None or ev.WhichOneof("event") != "chunk":
                raise WorkerFailed("the video worker's stream broke off inside the video")
            chunk = ev.chunk
        async for ev in self._events:
            if ev.WhichOneof("event") == "done":
                self.done = ev.done
                return
            if ev.WhichOneof("event") == "chunk":
                raise WorkerFailed("the video worker sent more than the one video asked for")
        raise WorkerFailed("the video worker ended its stream without its closing report")

    async def aclose(self) -> None:
        """Cancels the worker's call when the run is left early (a client gone, a lease lost)."""
        await close_events(self._events)
