"""A worker whose card says it publishes no KV events (``--no-kv-events``, or a kind without a prefix cache): a kv
router asks it for no dump and says, once, that it sees none of its cache (workers that publish nothing were a
silent misconfiguration in Dynamo: its PR 11194)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import nats
import pytest

from services.common.discovery import ModelCard, WorkerCard
from services.common.kv_events import dump_subject
from services.common.namespace import DEFAULT_NAMESPACE
from services.router.core.kv_ingest import KvEventIngest
from services.router.events import KvEventSubscriber
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

PUBLISHING = WorkerCard("w-events", "127.0.0.1:1", ModelCard("demo", "/models/demo"))
SILENT = WorkerCard("w-silent", "127.0.0.1:2", ModelCard("demo", "/models/demo"), kv_events=False)


async def test_a_kv_router_asks_a_silent_worker_for_no_dump_and_says_so_once(nats_url, caplog):
    asked: list[str] = []
    nc = await nats.connect(nats_url)

    async def answer(msg) -> None:
        asked.append(msg.subject)
        await msg.respond(b'{"seq": 0, "blocks": []}')

    for card in (PUBLISHING, SILENT):
        await nc.subscribe(dump_subject(DEFAULT_NAMESPACE, card.worker_id), cb=answer)
    await nc.flush()
    sub = KvEventSubscriber(nats_url, KvEventIngest(), lambda _w: True)
    await sub.start()
    try:
        with caplog.at_level(logging.WARNING, logger="services.router.events"):
            for card in (SILENT, PUBLISHING, dataclasses.replace(SILENT, address="127.0.0.1:3")):
                sub.on_worker_change(card.worker_id, card)
            await wait_for(lambda: asked, 5, "the publishing worker's dump request")
            await asyncio.sleep(0.3)
        assert asked == [dump_subject(DEFAULT_NAMESPACE, "w-events")]
        told = [r.getMessage() for r in caplog.records if "publishes no KV events" in r.getMessage()]
        assert len(told) == 1 and "w-silent" in told[0], told
    finally:
        await sub.close()
        await nc.close()


def test_a_card_without_the_field_reads_as_publishing():
    raw = SILENT.to_json().replace(b',"kv_events":false', b"")
    assert b"kv_events" not in raw and WorkerCard.from_json(raw).kv_events
    assert not WorkerCard.from_json(SILENT.to_json()).kv_events
