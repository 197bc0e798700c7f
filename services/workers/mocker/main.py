"""Wires the mocker: model directory -> output policy -> MockerEngine -> worker server."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.common.grpc_server import run, setup_logging
from services.common.kv_events import KvEventListener
from services.workers.config import ConfigError
from services.workers.mocker.config import MockerConfig, parse_config
from services.workers.kv_events import KvEventPublisher, mocker_load
from services.workers.mocker.engine import MockerEngine
from services.workers.mocker.outputs import OutputPolicy
from services.workers.model_dir import load_tokenizer, read_model_info
from services.workers.server import serve_worker


def build_engine(cfg: MockerConfig, listener: KvEventListener | None = None) -> MockerEngine:
    """Loads the tokenizer and script (blocking, startup only) and builds the engine."""
    tokenizer = load_tokenizer(cfg.worker.model_dir)
    outputs = OutputPolicy.build(tokenizer, script_path=cfg.engine.script or None,
                                 output_text=cfg.engine.output_text)
    info = read_model_info(cfg.worker.model_dir)
    return MockerEngine(cfg.engine, outputs, eos_token_ids=info.eos_token_ids, listener=listener)


async def serve(argv: Sequence[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.worker.log_level)
    # A registered worker tells the routers what its KV cache holds (KV-aware routing).
    publisher = KvEventPublisher(cfg.worker.nats_url, cfg.worker.worker_id, cfg.worker.model_name) \
        if cfg.worker.register else None
    engine = build_engine(cfg, listener=publisher)
    try:
        if publisher is not None:
            publisher.set_load_reader(mocker_load(engine))
            await publisher.start()
        await serve_worker(cfg.worker, engine, total_kv_blocks=cfg.engine.num_gpu_blocks,
                           max_num_batched_tokens=cfg.engine.max_num_batched_tokens)
    finally:
        if publisher is not None:
            await publisher.close()


def main() -> None:
    try:
        parse_config(sys.argv[1:])  # fail fast, with every problem listed, before any loop starts
    except ConfigError as e:
        sys.exit(f"mocker: {e}")
    run(lambda: serve(sys.argv[1:]))
