"""A scripted fake worker (a real grpc.aio WorkerService servicer) for the postprocessor tests.

The fake stands in for the engine only: it streams the worker messages a test scripts for a
request id, and records what it received and whether its handler was cancelled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common.errors import MeshError


@dataclass
class Forever:
    """Script step: keep the stream open, sending one message every ``every`` seconds."""

    message: worker_pb2.GenerateResponse = field(default_factory=worker_pb2.GenerateResponse)
    every: float = 3600.0


@dataclass
class Fail:
    """Script step: end the stream with this status (a raw code, or one of our MeshErrors)."""

    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    error: MeshError | None = None


class FakeWorker(worker_pb2_grpc.WorkerServiceServicer):
    """Streams scripted messages; a float step sleeps that many seconds."""

    def __init__(self) -> None:
        self.scripts: dict[str, list] = {}
        self.received: list[worker_pb2.GenerateRequest] = []
        self.peers: list[str] = []
        self.cancelled: dict[str, asyncio.Event] = {}

    def script(self, request_id: str, steps: list) -> asyncio.Event:
        """Sets the steps for ``request_id``; returns the event set when its handler is cancelled."""
        self.scripts[request_id] = steps
        return self.cancelled.setdefault(request_id, asyncio.Event())

    async def Generate(self, request, context):
        request_id = request.request.request_id
        self.received.append(request)
        self.peers.append(context.peer())
        try:
            for step in self.scripts[request_id]:
                if isinstance(step, float):
                    await asyncio.sleep(step)
                elif isinstance(step, Fail):
                    if step.error is not None:
                        raise step.error  # as a real worker does; its ErrorInterceptor sets the status
                    await context.abort(step.code, "scripted failure")
                elif isinstance(step, Forever):
                    while True:
                        yield step.message
                        await asyncio.sleep(step.every)
                else:
                    yield step
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled[request_id].set()
            raise
