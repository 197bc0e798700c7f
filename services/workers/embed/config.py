"""Embedding worker configuration: the shared worker flags plus batching and torch threads
(env twins MESHFRONT_EMBED_*)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser
from services.workers.config import ConfigError, WorkerConfig, add_worker_flags, worker_config_from_args
from services.workers.embed.model import ModelDirError, read_shape

KIND = "embed"


@dataclasses.dataclass(frozen=True)
class EmbedConfig:
    worker: WorkerConfig
    # torch intra-op threads; 0 keeps torch's default (one per core). One by default: a small model's
    # forward pass gains little from intra-op threads, and when the cores are shared OpenMP's
    # spin-waiting burns them (2 threads on a busy 2-core machine: 136 CPU ms per embedding against
    # 10.5 with 1, bench/RESULTS.md). Scale out with more workers; batching fills each one.
    threads: int = 1
    # Inputs per forward pass, and padded tokens (inputs x longest) per forward pass.
    max_batch_size: int = 32
    max_batch_tokens: int = 8192


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> EmbedConfig:
    """Parses and validates; raises ConfigError listing every problem."""
    p = FlagParser(KIND, "A sentence-embedding model on the CPU behind WorkerService.Embed.", env)
    add_worker_flags(p)
    p.add("--threads", default=1, type=int, help="torch intra-op threads (0 = torch's default, one per core)")
    p.add("--max-batch-size", default=32, type=int, help="inputs per forward pass")
    p.add("--max-batch-tokens", default=8192, type=int, help="padded tokens per forward pass (inputs x longest)")
    args = p.parse(argv)
    errors: list[str] = []
    context = args.context_length
    if args.model_dir and not context:
        try:  # the model's trained input length, not its position table (see model.py)
            context = read_shape(args.model_dir).max_input_tokens
        except (ModelDirError, OSError) as e:
            errors.append(f"--model-dir: {e}")
    cfg = EmbedConfig(worker=worker_config_from_args(args, KIND, context_length=context or None),
                      threads=args.threads, max_batch_size=args.max_batch_size,
                      max_batch_tokens=args.max_batch_tokens)
    errors += cfg.worker.validate()
    if cfg.threads < 0:
        errors.append("--threads must be >= 0")
    if cfg.max_batch_size < 1:
        errors.append("--max-batch-size must be at least 1")
    if cfg.max_batch_tokens < 1:
        errors.append("--max-batch-tokens must be at least 1")
    if errors:
        raise ConfigError(errors)
    return cfg
