"""The ZMQ subscriber against a publisher speaking vLLM's wire format (PUB + replay ROUTER, real sockets)."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from services.workers.engine_kv import BlocksRemoved, CacheCleared
from services.workers.engine_kv_zmq import ZmqKvSubscriber
from tests.conftest import wait_for

pytestmark = pytest.mark.unit


class Publisher:
    """vLLM's ZmqEventPublisher protocol: (topic, seq, payload) on PUB; replays from a ROUTER."""

    def __init__(self, tmp_path, keep: int = 100):
        self.ctx = zmq.asyncio.Context()
        self.endpoint = f"ipc://{tmp_path}/kv.ipc"
        self.replay_endpoint = f"ipc://{tmp_path}/replay.ipc"
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(self.endpoint)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(self.replay_endpoint)
        self.sent: list[tuple[int, bytes]] = []
        self.keep = keep
        self.task = asyncio.get_running_loop().create_task(self._serve_replays())

    async def publish(self, seq: int, payload: bytes, *, drop: bool = False) -> None:
        self.sent = [*self.sent, (seq, payload)][-self.keep:]
        if not drop:
            await self.pub.send_multipart((b"t", seq.to_bytes(8, "big"), payload))

    async def _serve_replays(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            for seq, payload in self.sent:
                if seq >= int.from_bytes(start, "big"):
                    await self.router.send_multipart((client, b"", b"t", seq.to_bytes(8, "big"), payload))
            await self.router.send_multipart((client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""))

    def close(self) -> None:
        self.task.cancel()
        self.pub.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()


def decode(payload: bytes):
    return [BlocksRemoved([payload.decode()])]


async def subscribed(tmp_path, keep=100):
    pub = Publisher(tmp_path, keep)
    seen = []
    sub = ZmqKvSubscriber(pub.endpoint, pub.replay_endpoint, decode, seen.append)
    sub.start()
    # ZMQ's slow joiner: the real worker connects before the engine publishes anything.
    await asyncio.sleep(0.3)
    return pub, sub, seen


def names(seen):
    return [e.engine_hashes[0] if isinstance(e, BlocksRemoved) else "cleared" for e in seen]


async def test_batches_apply_in_order_and_a_lost_one_is_replayed(tmp_path):
    pub, sub, seen = await subscribed(tmp_path)
    try:
        await pub.publish(0, b"a")
        await pub.publish(1, b"b", drop=True)  # lost on the PUB socket
        await pub.publish(2, b"c")
        await wait_for(lambda: len(seen) == 3, 5, "three batches")
        assert names(seen) == ["a", "b", "c"] and sub.replayed == 1 and sub.resets == 0
    finally:
        await sub.close()
        pub.close()


async def test_a_gap_the_replay_buffer_no_longer_holds_reports_the_cache_cleared(tmp_path):
    pub, sub, seen = await subscribed(tmp_path, keep=1)
    try:
        await pub.publish(0, b"a", drop=True)
        await pub.publish(1, b"b", drop=True)
        await pub.publish(2, b"c")
        await wait_for(lambda: len(seen) == 2, 5, "the reset and the next batch")
        assert isinstance(seen[0], CacheCleared) and names(seen) == ["cleared", "c"] and sub.resets == 1
    finally:
        await sub.close()
        pub.close()


async def test_a_batch_the_decoder_cannot_read_clears_the_cache_and_the_next_batches_still_apply(tmp_path):
    pub = Publisher(tmp_path)
    seen = []

    def strict_decode(payload: bytes):
        if payload == b"bad":
            raise OverflowError("int too big to convert")
        return decode(payload)

    sub = ZmqKvSubscriber(pub.endpoint, pub.replay_endpoint, strict_decode, seen.append)
    sub.start()
    await asyncio.sleep(0.3)
    try:
        await pub.publish(0, b"a")
        await pub.publish(1, b"bad")
        await pub.publish(2, b"c")
        await wait_for(lambda: len(seen) == 3, 5, "three batches")
        assert names(seen) == ["a", "cleared", "c"] and sub.undecodable == 1 and sub.batches == 3
    finally:
        await sub.close()
        pub.close()


async def test_a_close_that_lands_as_a_replay_ends_still_ends_the_subscription(tmp_path, monkeypatch):
    """The cancel and the replay's end in one turn of the loop: Python 3.11's wait_for returned the replay's
    result and dropped the cancel, the subscription went back to its socket and the closer waited forever
    (an engine_env test hung 300 s in CI)."""
    pub, sub, _seen = await subscribed(tmp_path)
    replaying, gate = asyncio.Event(), asyncio.get_running_loop().create_future()
    closing: asyncio.Task | None = None

    async def replay_until_the_gate_opens(_endpoint: str, _upto: int) -> None:
        replaying.set()
        await gate

    monkeypatch.setattr(sub, "_replay", replay_until_the_gate_opens)
    try:
        await pub.publish(1, b"b")  # batch 0 never came: a gap, so a replay
        await asyncio.wait_for(replaying.wait(), 5)
        gate.set_result(None)  # the replay ends on the loop's next turn; the close's cancel lands on the same one
        closing = asyncio.create_task(sub.close())
        done, _ = await asyncio.wait({closing}, timeout=5)  # not a timeout that cancels: close() would take that
        assert closing in done, "the subscription went on after its close"
    finally:
        if closing is not None and not closing.done():
            closing.cancel()
        pub.close()
