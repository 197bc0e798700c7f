"""hf worker configuration: the shared worker flags plus torch threads (env twins MESHFRONT_HF_*)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser
from services.workers.config import ConfigError, WorkerConfig, add_worker_flags, worker_config_from_args


@dataclasses.dataclass(frozen=True)
class HfConfig:
    worker: WorkerConfig
    # torch intra-op threads; 0 keeps torch's default (one per core).
    threads: int = 0


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> HfConfig:
    """Parses and validates; raises ConfigError listing every problem."""
    p = FlagParser("hf", "A transformers causal LM on the CPU behind the worker API.", env)
    add_worker_flags(p)
    p.add("--threads", default=0, type=int, help="torch threads (0 = torch's default)")
    args = p.parse(argv)
    cfg = HfConfig(worker=worker_config_from_args(args, "hf"), threads=args.threads)
    errors = cfg.worker.validate()
    if cfg.threads < 0:
        errors.append("--threads must be >= 0")
    if errors:
        raise ConfigError(errors)
    return cfg
