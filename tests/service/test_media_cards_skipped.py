"""A media worker's card (images, videos) in discovery: the stages that serve text models leave it alone.

No tokenizer or template to warm in the preprocessor and the postprocessor, no warm-up chat for the
gateway to send (its warm-up picks chat or completions, which a media card lists neither of), no KV
dump for a kv router to ask for. A text card beside it is handled as before.
"""

from __future__ import annotations

import asyncio

import pytest

from services.common.discovery import IMAGES, VIDEOS, MediaLimits, ModelCard, WorkerCard
from services.common.kv_events import dump_subject
from services.common.namespace import DEFAULT_NAMESPACE
from services.common.warmup import warm_each_new_model
from services.gateway.warmup import Warmup
from services.router.core.kv_ingest import KvEventIngest
from services.router.events import KvEventSubscriber
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

TEXT = WorkerCard("text-1", "127.0.0.1:1", ModelCard("demo", "/models/demo"))
IMAGE = WorkerCard("image-1", "127.0.0.1:2", ModelCard("demo-image", "", endpoints=(IMAGES,), media=MediaLimits()))
VIDEO = WorkerCard("video-1", "127.0.0.1:3", ModelCard("demo-video", "", endpoints=(VIDEOS,), media=MediaLimits(
    output_formats=("mp4", "mjpeg"), default_fps=8.0, max_frames=64, default_frames=16)))


class Registry:
    """What the warm-ups read of a WorkerRegistry: its listeners and its first-view event."""

    def __init__(self) -> None:
        self.listeners: list = []
        self.synced = asyncio.Event()

    def subscribe(self, listener) -> None:
        self.listeners.append(listener)

    def register(self, *cards: WorkerCard) -> None:
        for card in cards:
            for listener in self.listeners:
                listener(card.worker_id, card)


async def test_the_stages_warm_text_models_only():
    registry = Registry()
    warmed: list[str] = []

    async def warm(model: ModelCard) -> None:
        warmed.append(model.name)

    stop = warm_each_new_model(registry, warm)  # type: ignore[arg-type]
    registry.register(IMAGE, VIDEO, TEXT)
    await asyncio.sleep(0.05)
    await stop()
    assert warmed == ["demo"]


async def test_the_gateway_sends_no_warm_up_request_to_a_media_worker():
    class Pipeline:
        pinned: list[str] = []

        async def run(self, requests, n, worker_id="", hints=None, trace=None, *, options):  # Pipeline.run's shape
            self.pinned.append(worker_id)
            yield []

    registry, pipeline = Registry(), Pipeline()
    w = Warmup(pipeline, registry)  # type: ignore[arg-type]
    registry.register(IMAGE, VIDEO, TEXT)
    registry.synced.set()
    await asyncio.wait_for(w.run(), 5)
    assert w.ready.is_set() and pipeline.pinned == ["text-1"]


async def test_a_kv_router_asks_no_media_worker_for_its_kv_dump(nats_url):
    import nats

    asked: list[str] = []
    nc = await nats.connect(nats_url)

    async def answer(msg) -> None:
        asked.append(msg.subject)
        await msg.respond(b'{"seq": 0, "blocks": []}')

    for card in (TEXT, IMAGE, VIDEO):
        await nc.subscribe(dump_subject(DEFAULT_NAMESPACE, card.worker_id), cb=answer)
    await nc.flush()
    sub = KvEventSubscriber(nats_url, KvEventIngest(), lambda _w: True)
    await sub.start()
    try:
        for card in (IMAGE, VIDEO, TEXT):
            sub.on_worker_change(card.worker_id, card)
        await wait_for(lambda: asked, 5, "the text worker's dump request")
        await asyncio.sleep(0.3)
        assert asked == [dump_subject(DEFAULT_NAMESPACE, "text-1")]
    finally:
        await sub.close()
        await nc.close()
