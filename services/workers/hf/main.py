"""Wires the hf worker: model directory -> HfEngine (model loaded before serving) -> the worker entry."""

from __future__ import annotations

from collections.abc import Sequence

from services.workers import entry
from services.workers.hf.config import HfConfig, parse_config
from services.workers.hf.engine import HfEngine
from services.workers.model_dir import load_tokenizer, read_model_info
from services.workers.thinking_budget import thinking_markers


def build_engine(cfg: HfConfig) -> HfEngine:
    info = read_model_info(cfg.worker.model_dir)
    thinking = thinking_markers(cfg.worker.reasoning_parser, load_tokenizer(cfg.worker.model_dir))
    return HfEngine(cfg.worker.model_dir, context_length=cfg.worker.context_length,
                    eos_token_ids=info.eos_token_ids, threads=cfg.threads, thinking=thinking)


def prepare(cfg: HfConfig) -> HfConfig:
    try:
        import torch  # noqa: F401 - only to give a clear message when the extra is missing
    except ImportError:
        raise entry.Unavailable("torch is not installed; install the hf extra: pip install -e '.[hf]'") from None
    return cfg


async def build(cfg: HfConfig, events: entry.KvEvents) -> entry.Serving:
    engine = build_engine(cfg)
    await engine.start()  # loads the model: "port open" means "ready"
    return entry.engine_serving(cfg.worker, engine)  # no prefix cache: no KV events, no load


KIND = entry.WorkerKind(name="hf", parse=parse_config, log_level=lambda cfg: cfg.worker.log_level,
                        prepare=prepare, build=build)


def main(argv: Sequence[str] | None = None) -> None:
    entry.main(KIND, argv)
