"""The one worker entry (services/workers/entry.py): one KV event publisher, fed by the engine's events
and its ``read_load``, whatever the kind."""

from __future__ import annotations

import pytest

from services.workers import entry
from services.workers.engine import EngineRequest
from services.workers.mocker import main as mocker_main
from services.workers.mocker.config import parse_config

pytestmark = pytest.mark.unit


async def test_the_mocker_sends_its_cache_and_load_through_the_entrys_publisher(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--port", "0", "--speedup-ratio", "0",
                        "--num-gpu-blocks", "64"], {})
    events = entry.KvEvents()
    serving = await mocker_main.build(cfg, events)
    try:
        publisher = events.publisher
        assert publisher is not None and (publisher.worker_id, publisher.model) == (cfg.worker.worker_id,
                                                                                     cfg.worker.model_name)
        engine = serving.load.__self__  # the engine's own read_load, no per-kind adapter
        assert serving.load() == {"active_blocks": 0, "waiting": 0, "running": 0, "total_blocks": 64}
        async for _ in engine.generate(EngineRequest("r1", list(range(40)), max_tokens=2)):
            pass
        assert len(publisher.mirror.dump()) == 40 // 16  # the full blocks it cached, seen by the publisher
        assert serving.card.total_kv_blocks == 64 and serving.card.worker_id == cfg.worker.worker_id
    finally:
        await serving.server.server.stop(0)  # bound, never started
        for close in serving.closers:
            await close()


async def test_a_worker_that_does_not_register_publishes_nothing(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--port", "0", "--no-register"], {})
    events = entry.KvEvents()
    serving = await mocker_main.build(cfg, events)
    try:
        assert events.publisher is None and serving.load is not None
    finally:
        await serving.server.server.stop(0)  # bound, never started
        for close in serving.closers:
            await close()


async def test_a_worker_with_no_kv_events_publishes_nothing_and_its_card_says_so(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--port", "0", "--no-kv-events"], {})
    assert cfg.worker.register and not cfg.worker.kv_events
    events = entry.KvEvents()
    serving = await mocker_main.build(cfg, events)
    try:
        assert events.publishers == {} and not serving.card.kv_events
    finally:
        await serving.server.server.stop(0)  # bound, never started
        for close in serving.closers:
            await close()
