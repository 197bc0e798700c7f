"""A KV watch without nats-py's always-on flow-control poller (services/common/kv_watch.py) still gets every
value, answers JetStream's flow-control request once what came before it is delivered, and polls nothing
at rest."""

from __future__ import annotations

import asyncio

import nats
import pytest

from services.common.kv_watch import quiet_flow_control

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
