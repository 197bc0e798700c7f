"""The media worker as a transport-free service over any ``MediaEngine``: a GenerateMediaRequest in, its
GenerateMediaResponse events out (progress and partials while it runs, each output's <= 1 MiB chunks,
then done).

The engine's blocking ``generate`` runs in a thread of its own; what it yields crosses to the event
loop through a queue. Encoding (PNG ... MP4) runs in threads too, so the loop only moves bytes. A
caller that goes away closes the event stream, which sets the engine's ``cancelled``: the engine
stops at its next step. The job's slot is given back when the engine's thread ends, not when the call
ends, so a cancelled job still counts against ``--max-running-jobs`` until its engine has let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator

from meshfront.worker.v1 import media_pb2

from services.common.errors import Internal, Overloaded
from services.workers.media.checks import build_job, check_request
from services.workers.media.config import DEFAULT_JOBS, JobLimits
from services.workers.media.encode import content_type, encode_image, encode_video
from services.workers.media.engine import MediaEngine, MediaEvent, MediaJob, Output, Preview, StepDone

log = logging.getLogger(__name__)

# Under every hop's gRPC message limit and Envoy's buffers; the proto promises at most this.
CHUNK_BYTES = 1 << 20


class JobSlots:
    """At most ``max_running`` jobs hold a slot; ``max_waiting`` more may wait for one; beyond that a job
    is refused at once (``Overloaded``)."""

    def __init__(self, limits: JobLimits):
        self.limits = limits
        self._free = asyncio.Semaphore(limits.max_running)
        self.waiting = 0
        self.running = 0

    async def acquire(self) -> None:
        if self._free.locked() and self.waiting >= self.limits.max_waiting:
            raise Overloaded(f"this worker is busy: {self.running} jobs running and {self.waiting} waiting")
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        self.running += 1

    def release(self) -> None:
        self.running -= 1
        self._free.release()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class EngineThread:
    """One job's ``generate`` in its own thread; its events on the event loop via ``events``."""

    def __init__(self, engine: MediaEngine, job: MediaJob, on_end: Callable[[], None]):
        self.cancelled = threading.Event()
        self._engine, self._job, self._on_end = engine, job, on_end
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._thread = threading.Thread(target=self._run, name="media-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _post(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed under a stopping server: nobody listens
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _run(self) -> None:
        events: Iterator[MediaEvent] | None = None
        try:
            events = self._engine.generate(self._job, self.cancelled)
            for event in events:
                if self.cancelled.is_set():
                    break
                self._post(event)
        except BaseException as e:  # noqa: BLE001 - handed to the caller, whose error interceptor reports it
            self._post(_Failed(e))
        finally:
            if isinstance(events, Generator):
                with contextlib.suppress(Exception):
                    events.close()  # a generator engine's own cleanup (its finally) runs now, in its thread
            self._post(_END)
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._on_end)

    async def events(self) -> AsyncIterator[MediaEvent]:
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item  # type: ignore[misc]


class MediaService:
    def __init__(self, engine: MediaEngine, jobs: JobLimits = DEFAULT_JOBS):
        self.engine = engine
        self.slots = JobSlots(jobs)

    async def generate(self, req: media_pb2.GenerateMediaRequest
                       ) -> AsyncGenerator[media_pb2.GenerateMediaResponse, None]:
        limits = self.engine.limits
        check_request(req, limits)
        job = await asyncio.to_thread(build_job, req, limits)  # decoding an upload is CPU work
        input_tokens = await asyncio.to_thread(self.engine.count_tokens, req.prompt)
        await self.slots.acquire()
        run = EngineThread(self.engine, job, self.slots.release)  # the thread gives the slot back
        started = time.monotonic()
        run.start()
        try:
            outputs = 0
            async for event in run.events():
                if isinstance(event, StepDone):
                    yield media_pb2.GenerateMediaResponse(
                        progress=media_pb2.MediaProgress(step=event.step, total_steps=event.total_steps))
                elif isinstance(event, Preview):
                    data = await asyncio.to_thread(self._encode_preview, req, event)
                    yield media_pb2.GenerateMediaResponse(partial=media_pb2.MediaPartial(
                        index=event.index, partial_index=event.partial_index, data=data))
                else:
                    if event.index != outputs:
                        raise Internal(f"the engine sent output {event.index} where {outputs} was due")
                    data = await asyncio.to_thread(self._encode_output, req, job, event)
                    outputs += 1
                    for chunk in chunks(event.index, data):
                        yield chunk
                    del data
            if outputs != job.n:
                raise Internal(f"the engine ended after {outputs} of {job.n} outputs")
            yield media_pb2.GenerateMediaResponse(done=media_pb2.MediaDone(
                inference_time_s=time.monotonic() - started, content_type=content_type(req.output_format),
                num_frames=job.num_frames, fps=job.fps, input_tokens=input_tokens,
                output_tokens=latent_positions(job, limits.size_multiple)))
        finally:
            run.cancelled.set()  # a no-op after the last event; after a caller's cancel, the engine stops

    @staticmethod
    def _encode_preview(req: media_pb2.GenerateMediaRequest, preview: Preview) -> bytes:
        image_format = "png" if req.kind == media_pb2.MEDIA_KIND_VIDEO else req.output_format
        return encode_image(preview.image, image_format, quality=_quality(req),
                            transparent=req.background == "transparent")

    @staticmethod
    def _encode_output(req: media_pb2.GenerateMediaRequest, job: MediaJob, output: Output) -> bytes:
        if job.kind == "video":
            if len(output.frames) != job.num_frames:
                raise Internal(f"the engine made {len(output.frames)} frames of {job.num_frames}")
            return encode_video(output.frames, req.output_format, job.fps, quality=_quality(req))
        [image] = output.frames
        return encode_image(image, req.output_format, quality=_quality(req),
                            transparent=req.background == "transparent")


def _quality(req: media_pb2.GenerateMediaRequest) -> int | None:
    return req.output_compression if req.HasField("output_compression") else None


def chunks(index: int, data: bytes) -> Iterator[media_pb2.GenerateMediaResponse]:
    """One output's bytes as MediaChunk events of at most CHUNK_BYTES, ``last`` on the final one."""
    view = memoryview(data)
    for start in range(0, max(len(data), 1), CHUNK_BYTES):
        piece = view[start:start + CHUNK_BYTES]
        yield media_pb2.GenerateMediaResponse(chunk=media_pb2.MediaChunk(
            index=index, data=bytes(piece), last=start + CHUNK_BYTES >= len(data)))


def latent_positions(job: MediaJob, factor: int) -> int:
    """usage.output_tokens: the latent positions generated, (width/f) x (height/f) per frame, across outputs,
    ``f`` the model's size multiple (its VAE's downsampling)."""
    per_frame = -(-job.width // factor) * -(-job.height // factor)
    return per_frame * max(job.num_frames, 1) * job.n
