"""A stand-in for SGLang's prefill/decode pair (a real grpc.aio WorkerService on the real mux stream glue).

It behaves as SGLang's servers do towards a caller (docs/engines.md, "Disaggregation"), as the worker's SGLang
adapter presents them (services/workers/sglang/engine.py):

- a **prefill** leg announces its bootstrap (host, port, a room it draws) in a first chunk with no tokens, then
  waits until a decode leg has connected for that room (failing after ``bootstrap_timeout_s``, as SGLang's
  bootstrap timeout does), computes, sends the KV with the first token, and only then returns that token;
- a **decode** leg connects to its room (a malformed or unknown one is a refused transfer naming
  ``kv_transfer_params``), waits for the KV, and returns the first token, then the rest;
- an aggregated request (no role) generates every token itself.

Tokens are a chain over the whole context (each one a function of everything before it), so an aggregated
answer, a disaggregated one and a migrated one are token-identical exactly when nothing was lost or doubled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets

import orjson
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common.errors import WorkerFailed
from services.common.mux_session import MuxSession


def next_token(context: list[int]) -> int:
    return 1000 + (sum(context) * 31 + len(context) * 7) % 3000


@dataclasses.dataclass
class Room:
    connected: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    sent: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    first: int = 0


@dataclasses.dataclass
class Timing:
    """Seconds each phase takes; which leg's first token comes first follows from them."""

    prefill_s: float = 0.0  # after the decode leg connected
    prefill_token_after_kv_s: float = 0.0  # the prefill leg returns its token this long after the KV went
    decode_first_after_kv_s: float = 0.0  # the decode leg returns the first token this long after the KV came
    step_s: float = 0.001
    bootstrap_timeout_s: float = 2.0


class PairWorker(worker_pb2_grpc.WorkerServiceServicer):
    """One SGLang-like worker; the ``rooms`` dict is the bootstrap all workers of a test share."""

    def __init__(self, rooms: dict[int, Room], timing: Timing | None = None):
        self.rooms = rooms
        self.timing = timing or Timing()
        self.received: list[common_pb2.PreprocessedRequest] = []
        self.cancelled: dict[str, asyncio.Event] = {}
        self.fail_prefill = False  # after the decode leg connected
        self.fail_decode_after: int | None = None  # tokens sent before the decode leg fails
        self.address = ""

    async def GenerateStream(self, request_iterator, context):
        session = MuxSession(lambda r: self._sequence(r.request), context.write,
                             worker_pb2.GenerateStreamResponse, "pair.GenerateStream")
        await session.run(request_iterator)

    def cancel_event(self, request_id: str) -> asyncio.Event:
        return self.cancelled.setdefault(request_id, asyncio.Event())

    async def _sequence(self, request: common_pb2.PreprocessedRequest):
        self.received.append(request)
        cancelled = self.cancel_event(request.request_id)
        role = request.disaggregation.role
        try:
            if role == common_pb2.DISAGGREGATION_ROLE_PREFILL:
                async for message in self._prefill(request):
                    yield message
            elif role == common_pb2.DISAGGREGATION_ROLE_DECODE:
                async for message in self._decode(request):
                    yield message
            else:
                async for message in self._generate(request, list(request.token_ids), []):
                    yield message
        except (asyncio.CancelledError, GeneratorExit):
            cancelled.set()
            raise

    async def _prefill(self, request: common_pb2.PreprocessedRequest):
        room_id = secrets.randbits(63)
        room = self.rooms[room_id] = Room()
        params = orjson.dumps({"do_remote_prefill": True, "bootstrap_host": "127.0.0.1",
                               "bootstrap_port": 8998, "bootstrap_room": room_id})
        yield worker_pb2.GenerateResponse(kv_transfer_params=params)
        try:
            await asyncio.wait_for(room.connected.wait(), self.timing.bootstrap_timeout_s)
        except TimeoutError:
            raise WorkerFailed("bootstrap timeout: no decode server connected") from None
        await asyncio.sleep(self.timing.prefill_s)
        if self.fail_prefill:
            raise WorkerFailed("the prefill server died")
        room.first = next_token(list(request.token_ids))
        room.sent.set()
        await asyncio.sleep(self.timing.prefill_token_after_kv_s)
        yield worker_pb2.GenerateResponse(token_ids=[room.first], finish_reason=common_pb2.FINISH_REASON_LENGTH,
                                          prompt_tokens=len(request.token_ids), kv_transfer_params=params)

    async def _decode(self, request: common_pb2.PreprocessedRequest):
        params = orjson.loads(request.disaggregation.kv_transfer_params)
        room = self.rooms.get(params.get("bootstrap_room"))
        if room is None:
            raise WorkerFailed("no such bootstrap room", param="kv_transfer_params")
        room.connected.set()
        await room.sent.wait()
        await asyncio.sleep(self.timing.decode_first_after_kv_s)
        context = list(request.token_ids)
        assert room.first == next_token(context), "the decode leg's prompt is not the prefill leg's"
        async for message in self._generate(request, context, [room.first]):
            yield message

    async def _generate(self, request: common_pb2.PreprocessedRequest, context: list[int], first: list[int]):
        prompt_tokens = len(context)
        for i in range(request.stop.max_tokens):
            if self.fail_decode_after is not None and i >= self.fail_decode_after:
                raise WorkerFailed("the decode server died")
            token = first[0] if first and i == 0 else next_token(context)
            context.append(token)
            done = i == request.stop.max_tokens - 1
            message = worker_pb2.GenerateResponse(
                token_ids=[token], finish_reason=common_pb2.FINISH_REASON_LENGTH if done else 0)
            if i == 0:
                message.prompt_tokens = prompt_tokens
                message.cached_tokens = prompt_tokens if first else 0
            yield message
            await asyncio.sleep(self.timing.step_s)
