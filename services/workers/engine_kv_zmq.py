"""Receives an engine's KV events from its ZMQ publisher (vLLM's and SGLang's share the wire format).

The engine core (another process) publishes ``(topic, seq as 8 bytes big-endian, msgpack batch)``
on a PUB socket and keeps recent batches for replay on a ROUTER socket: a subscriber that sees
``seq`` jump asks for everything from the first missing one and gets ``(b"", topic, seq, batch)``
frames up to an end marker of seq -1. The subscriber applies batches strictly in ``seq`` order,
so the translator's engine-hash map never misses a store. When the replay buffer no longer holds
the gap, the worker's blocks are reported cleared (the routers under-predict rather than point
at blocks that may be gone) and indexing starts again from the next batch.

Decoding is the engine adapter's: it knows its engine's event classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from services.workers.engine_kv import CacheCleared, EngineKvEvent

log = logging.getLogger(__name__)

END_SEQ = -1
REPLAY_TIMEOUT_S = 2.0

Decoder = Callable[[bytes], Sequence[EngineKvEvent]]
Sink = Callable[[EngineKvEvent], None]


def _seq(raw: bytes) -> int:
    return int.from_bytes(raw, "big", signed=True)


class ZmqKvSubscriber:
    """Connects before the engine serves anything (so it sees batch 0) and feeds ``sink`` in order."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, decode: Decoder, sink: Sink):
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._decode = decode
        self._sink = sink
        self._ctx = zmq.asyncio.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.RCVHWM, 0)  # never drop: a dropped batch costs a replay
        self._sub.connect(endpoint)
        self._next_seq = 0
        self._task: asyncio.Task | None = None
        self.batches = 0
        self.replayed = 0
        self.resets = 0
        self.undecodable = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-kv-events")

    async def _run(self) -> None:
        while True:
            _topic, raw_seq, payload = await self._sub.recv_multipart()
            seq = _seq(raw_seq)
            if seq < self._next_seq:
                continue  # already applied through a replay
            if seq > self._next_seq:
                await self._fill_gap(seq)
            self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            events = self._decode(payload)
        except Exception:
            # A batch the decoder cannot read (an engine upgrade's new field, a value out of range) is
            # a lost batch, not the end of the subscription: ending it would leave the router's view of
            # this worker frozen for good. The index may now hold blocks the engine evicted, so it is
            # reported cleared, as for a gap the replay could not fill.
            log.exception("could not decode KV event batch %d: reporting the cache cleared", seq)
            events = (CacheCleared(),)
            self.undecodable += 1
        for event in events:
            self._sink(event)
        self._next_seq = seq + 1
        self.batches += 1

    async def _fill_gap(self, upto: int) -> None:
        """Replays batches ``_next_seq .. upto-1``; reports the cache cleared when it cannot."""
        missing = self._next_seq
        if self.replay_endpoint is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPLAY_TIMEOUT_S):
                    await self._replay(self.replay_endpoint, upto)
        if self._next_seq < upto:
            log.warning("lost KV event batches %d..%d (replay from %d fell short): reporting the cache "
                        "cleared until new stores arrive", self._next_seq, upto - 1, missing)
            self._sink(CacheCleared())
            self._next_seq = upto
            self.resets += 1

    async def _replay(self, endpoint: str, upto: int) -> None:
        dealer = self._ctx.socket(zmq.DEALER)
        try:
            dealer.connect(endpoint)
            await dealer.send_multipart((b"", self._next_seq.to_bytes(8, "big")))
            while True:
                _empty, _topic, raw_seq, payload = await dealer.recv_multipart()
                seq = _seq(raw_seq)
                if seq == END_SEQ:
                    return
                if seq == self._next_seq and seq < upto:
                    self._apply(seq, payload)
                    self.replayed += 1
        finally:
            dealer.close(linger=0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sub.close(linger=0)
        self._ctx.term()
