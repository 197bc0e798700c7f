"""The response store against a real nats-server: put/get/delete, per-record TTL, two stores sharing it."""

import asyncio

import pytest

from services.common.nats_store import StoreUnavailable
from services.gateway.responses_api.store import ResponseStore
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

RECORD = {"response": {"id": "resp_1", "output": [{"type": "message", "content": [{"text": "héllo " * 50000}]}]},
          "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}]}


async def started(url: str, ttl_s: int = 60) -> tuple[ResponseStore, asyncio.Task]:
    store = ResponseStore(url, ttl_s)
    task = asyncio.create_task(store.run())
    await wait_for(lambda: store.ready, 10, "the store to open its bucket")
    return store, task


async def test_put_get_delete_across_two_stores(nats_url):
    a, ta = await started(nats_url)
    b, tb = await started(nats_url)
    try:
        await a.put("resp_1", RECORD)  # 600 KB of text: compressed well under NATS's 1 MiB payload limit
        assert await b.get("resp_1") == RECORD
        assert await b.get("resp_unknown") is None
        assert await b.get("bad key with spaces") is None
        assert await b.delete("resp_1") is True
        assert await a.get("resp_1") is None
        assert await a.delete("resp_1") is False
    finally:
        for store, task in ((a, ta), (b, tb)):
            task.cancel()
            await store.close()


async def test_records_expire_after_the_ttl(nats_url):
    store, task = await started(nats_url, ttl_s=1)
    try:
        await store.put("resp_short", RECORD)
        assert await store.get("resp_short") is not None
        deadline = asyncio.get_running_loop().time() + 10
        while await store.get("resp_short") is not None:
            assert asyncio.get_running_loop().time() < deadline, "the record outlived its TTL"
            await asyncio.sleep(0.2)
    finally:
        task.cancel()
        await store.close()


async def test_no_nats_is_a_503_not_a_hang():
    store = ResponseStore("nats://127.0.0.1:1", 60, wait_s=0.3)
    task = asyncio.create_task(store.run())
    try:
        with pytest.raises(StoreUnavailable) as e:
            await store.get("resp_1")
        assert e.value.http_status == 503
    finally:
        task.cancel()
        await store.close()
