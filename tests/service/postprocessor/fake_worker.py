"""A scripted fake worker (a real grpc.aio WorkerService servicer) for the postprocessor tests.

The fake stands in for the engine only: on the real multiplexed ``GenerateStream`` it streams the
worker messages a test scripts for a request id, and records what it received, from which peer, and
whether the sequence was cancelled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common.errors import Internal, MeshError, WorkerFailed
from services.common.mux_session import MuxSession


@dataclass
class Forever:
    """Script step: keep the stream open, sending one message every ``every`` seconds."""

    message: worker_pb2.GenerateResponse = field(default_factory=worker_pb2.GenerateResponse)
    every: float = 3600.0


@dataclass
class Fail:
    """Script step: fail the sequence (WORKER_FAILED, INTERNAL for that code, or one of our MeshErrors)."""

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
        """Sets the steps for ``request_id``; returns the event set when its sequence is cancelled."""
        self.scripts[request_id] = steps
        return self.cancelled.setdefault(request_id, asyncio.Event())

    async def GenerateStream(self, request_iterator, context):
        # The real server's stream glue (services/common/mux_session.py) around the scripted sequences.
        peer = context.peer()

        def sequence(request: worker_pb2.GenerateRequest):
            self.peers.append(peer)
            return self._sequence(request)
        session = MuxSession(sequence, context.write, worker_pb2.GenerateStreamResponse, "fake.GenerateStream")
        await session.run(request_iterator)

    async def _sequence(self, request: worker_pb2.GenerateRequest):
        request_id = request.request.request_id
        self.received.append(request)
        try:
            for step in self.scripts[request_id]:
                if isinstance(step, float):
                    await asyncio.sleep(step)
                elif isinstance(step, Fail):
                    # A sequence fails with a status of its own on the shared stream: ours, or the one a
                    # crashed engine's would be.
                    raise step.error or (Internal("scripted failure") if step.code == grpc.StatusCode.INTERNAL
                                         else WorkerFailed("scripted failure"))
                elif isinstance(step, Forever):
                    while True:
                        yield step.message
                        await asyncio.sleep(step.every)
                else:
                    yield step
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled[request_id].set()
            raise
