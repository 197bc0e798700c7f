"""A subscription is live at the server once ``flush_in_order`` returns: a message another connection
publishes right after reaches it (nats-py's own flush can return before the SUB is written)."""

from __future__ import annotations

import asyncio

import nats
import pytest

from services.common.nats_connection import flush_in_order

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


async def test_a_message_published_right_after_reaches_the_new_subscription(nats_url):
    publisher = await nats.connect(nats_url)
    missed = 0
    try:
        for i in range(150):
            subscriber = await nats.connect(nats_url)
            got = asyncio.Event()

            async def on_message(_msg, got=got):
                got.set()

            await subscriber.subscribe(f"order.{i}", cb=on_message)
            await flush_in_order(subscriber)
            await publisher.publish(f"order.{i}", b"x")
            await publisher.flush()
            try:
                await asyncio.wait_for(got.wait(), 2)
            except TimeoutError:
                missed += 1
            await subscriber.close()
    finally:
        await publisher.close()
    assert missed == 0
