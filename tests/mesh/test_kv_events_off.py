"""Workers a round-robin mesh starts publish no KV events or load reports: only a kv router reads them, and on the
same vLLM engine publishing them cost the frontend side a fifth of its CPU per request (bench/RESULTS.md). The
launcher starts them with --no-kv-events and their cards say so (a kv router then warns: router/events.py)."""

from __future__ import annotations

import asyncio

import nats
import pytest

from services.common.discovery import WorkerCard, open_bucket
from services.common.kv_events import EVENTS_PREFIX
from services.workers.kv_events import LOAD_INTERVAL_S
from tests.mesh.conftest import DEMO

pytestmark = pytest.mark.mesh


async def _published_while(nats_url: str, send, quiet_s: float) -> tuple[list[str], list[WorkerCard]]:
    """The subjects published under the KV event prefix while ``send`` runs and ``quiet_s`` after; every card."""
    nc = await nats.connect(nats_url)
    try:
        subjects: list[str] = []

        async def take(msg) -> None:
            subjects.append(msg.subject)

        await nc.subscribe(f"{EVENTS_PREFIX}.>", cb=take)
        await nc.flush()
        await asyncio.to_thread(send)
        await asyncio.sleep(quiet_s)
        kv = await open_bucket(nc)
        cards = [WorkerCard.from_json((await kv.get(key)).value) for key in await kv.keys()]
        return subjects, cards
    finally:
        await nc.close()


def test_a_round_robin_meshs_workers_publish_no_kv_events_and_say_so(mesh, client):
    assert not mesh.plan.routes_by_kv_events

    def send() -> None:
        for i in range(4):  # every worker of the demo model gets some (round robin), each stores blocks
            client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": f"Story {i}, please."}],
                                           max_tokens=8)

    # A publishing worker sends its stored blocks, and its load that moved, within a tick of the request's end.
    subjects, cards = asyncio.run(_published_while(mesh.plan.nats_url, send, 2 * LOAD_INTERVAL_S))
    assert subjects == []
    assert len(cards) == 3 and not any(card.kv_events for card in cards), cards
