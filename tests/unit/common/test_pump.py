"""services/common/pump.py: the inbox a multiplexed call's responses wait in, taken all at once."""

from __future__ import annotations

import asyncio

import pytest

from services.common.errors import WorkerFailed
from services.common.pump import Inbox, batch_of

pytestmark = pytest.mark.unit

END = object()


async def test_take_hands_over_everything_queued_in_order():
    inbox = Inbox(END)
    for item in ("a", "b", "c"):
        inbox.put(item)
    batch = await inbox.take()
    assert batch.messages == ["a", "b", "c"] and not batch.ended and batch.error is None
    inbox.put("d")
    assert (await inbox.take()).messages == ["d"]  # the first take emptied it


async def test_take_waits_for_the_first_item_then_takes_what_came_with_it():
    inbox = Inbox(END)
    taker = asyncio.create_task(inbox.take())
    await asyncio.sleep(0)
    assert not taker.done()
    inbox.put("a")
    inbox.put("b")  # before the taker runs: it gets both in one batch
    assert (await taker).messages == ["a", "b"]


async def test_the_end_and_an_error_are_told_apart_from_messages():
    inbox = Inbox(END)
    error = WorkerFailed("worker failed")
    inbox.put("a")
    inbox.put(error)
    inbox.put("b")
    inbox.put(END)
    batch = await inbox.take()
    assert batch.messages == ["a", "b"] and batch.ended and batch.error is error
    assert batch_of([END], END).ended and batch_of([END], END).messages == []


async def test_a_taker_cancelled_while_waiting_leaves_the_inbox_usable():
    inbox = Inbox(END)
    taker = asyncio.create_task(inbox.take())
    await asyncio.sleep(0)
    taker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taker
    inbox.put("a")  # no waiter is left behind to set: this must not raise InvalidStateError
    assert (await asyncio.wait_for(inbox.take(), 1)).messages == ["a"]
