"""A KV watch without nats-py's always-on flow-control poller (services/common/kv_watch.py) still gets every
value, answers JetStream's flow-control request once what came before it is delivered, and polls nothing
at rest. And the readers that wait for a watch's first values (discovery, the API keys) wait for all of them,
also when nats-py's end marker comes first."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.kv import KeyValue

from services.common.discovery import ModelCard, Registrar, WorkerCard, WorkerRegistry
from services.common.kv_watch import FirstValues, key_count, quiet_flow_control
from services.common.namespace import DEFAULT_NAMESPACE
from services.gateway.auth.store import KEYS_BUCKET, AuthStore

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

VALUES = 300


async def test_a_quiet_watch_delivers_everything_answers_flow_control_and_sleeps_at_rest(nats_url):
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().create_key_value(bucket="quiet", history=1)
        for i in range(VALUES):
            await kv.put(f"k{i}", str(i).encode())
        watcher = quiet_flow_control(await kv.watchall())
        jsi = watcher._sub._sub._jsi  # type: ignore[union-attr]
        assert jsi._fctask is None  # no poller while nothing is asked
        seen = {}
        while (entry := await watcher.updates(timeout=10)) is not None:
            seen[entry.key] = entry.value
        assert seen == {f"k{i}": str(i).encode() for i in range(VALUES)}

        # JetStream's flow-control request, as nats-py's reader hands it over: the reply goes out once the
        # messages before it are delivered (they are), and the check ends with it.
        replies: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_reply(msg):
            await replies.put(msg.data)

        await nc.subscribe("fc.reply", cb=on_reply)
        jsi.schedule_flow_control_response("fc.reply")
        assert await asyncio.wait_for(replies.get(), 5) == b""
        await asyncio.sleep(0.05)
        assert jsi._fctask.done() and jsi._fcr is None

        await kv.put("later", b"x")
        entry = await watcher.updates(timeout=10)
        assert entry is not None and entry.key == "later" and entry.value == b"x"
        await watcher.stop()
    finally:
        await nc.close()


HELD_S = 0.5  # how long the first values come after the marker


@pytest.fixture
def marker_first(monkeypatch):
    """Every new watch gets nats-py's end marker at once and its first values ``HELD_S`` later, as when the
    consumer's info (nothing pending, nothing received yet) overtook values the server had sent (CI, loaded)."""
    watch = KeyValue.watch

    async def early(self, *args, **kwargs):
        watcher = await watch(self, *args, **kwargs)
        watcher._init_done = True  # nats-py sends one marker a watch: this one
        held = []
        while not watcher._updates.empty():
            if (entry := watcher._updates.get_nowait()) is not None:
                held.append(entry)
        watcher._updates.put_nowait(None)
        asyncio.get_running_loop().call_later(HELD_S, lambda: [watcher._updates.put_nowait(e) for e in held])
        return watcher

    monkeypatch.setattr(KeyValue, "watch", early)


async def test_first_values_are_in_once_every_counted_key_came_not_at_the_marker(nats_url, marker_first):
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="first", history=1)
        for key in ("a.1", "a.2", "b.1"):
            await kv.put(key, b"v")
        await kv.delete("a.2")  # a delete marker is a key's last message: the watch hands it over too
        first = FirstValues(await key_count(js, "first", "a.>"))
        assert first.expected == 2
        watcher = await kv.watch("a.>")
        assert await watcher.updates(timeout=5) is None and not first.took(None) and not first.complete
        got = [await watcher.updates(timeout=5) for _ in range(2)]
        assert [first.took(e) for e in got] == [False, True] and {e.key for e in got} == {"a.1", "a.2"}
        await watcher.stop()
        assert FirstValues(await key_count(js, "first", "c.>")).complete  # nothing to wait for
        gone = FirstValues(1)  # a counted key that expired before the watch: a quiet watch past the marker ends it
        assert not gone.quiet() and not gone.took(None) and gone.quiet()
    finally:
        await nc.close()


async def test_discovery_is_synced_once_the_cards_are_in_not_at_an_early_marker(nats_url, marker_first):
    registrars = [Registrar(nats_url, WorkerCard(worker_id=f"w{i}", address=f"127.0.0.1:{1000 + i}",
                                                 model=ModelCard(name="demo", model_dir="/m"))) for i in range(3)]
    for registrar in registrars:
        await registrar.start()
    for registrar in registrars:
        await registrar.update(registrar.card, timeout_s=5)  # in the bucket
    registry = WorkerRegistry(nats_url, "reader")
    await registry.start()
    try:
        await asyncio.wait_for(registry.synced.wait(), 10)
        assert set(registry.workers) == {"w0", "w1", "w2"}  # a gateway just started serves them at once
    finally:
        await registry.close()
        for registrar in registrars:
            await registrar.close()


async def test_the_api_keys_are_synced_once_all_are_applied_not_at_an_early_marker(nats_url, marker_first):
    store = AuthStore(nats_url, DEFAULT_NAMESPACE)
    nc = await nats.connect(nats_url)
    applied: dict[str, bytes | None] = {}
    synced = asyncio.Event()
    follow = None
    try:
        await store.opened()  # creates the buckets
        keys = await nc.jetstream().key_value(DEFAULT_NAMESPACE.bucket(KEYS_BUCKET))
        for i in range(3):
            await keys.put(f"hash{i}", b"{}")
        follow = asyncio.create_task(store.follow_keys(applied.__setitem__, synced))
        await asyncio.wait_for(synced.wait(), 10)
        assert set(applied) == {"hash0", "hash1", "hash2"}  # else a valid key is refused as unknown
    finally:
        if follow is not None:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
        await store.close()
        await nc.close()
