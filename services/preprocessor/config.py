"""Preprocessor configuration: flags with MESHFRONT_PREPROCESSOR_* env twins."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, add_common_flags
from services.preprocessor.service import DEFAULT_OFFLOAD_THRESHOLD

DEFAULT_PORT = 9200


@dataclasses.dataclass(frozen=True)
class PreprocessorConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    nats_url: str = "nats://127.0.0.1:4222"
    log_level: str = "INFO"
    metrics_port: int = 0
    offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD
    grace_s: float = 10.0

    def validate(self) -> None:
        errors = []
        if not 0 <= self.port <= 65535:
            errors.append(f"--port {self.port} is not a valid port")
        if self.offload_threshold < 0:
            errors.append("--offload-threshold must be >= 0")
        if self.grace_s < 0:
            errors.append("--grace-s must be >= 0")
        if errors:
            raise ValueError("; ".join(errors))


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> PreprocessorConfig:
    p = FlagParser("preprocessor", "Chat templates, tokenization and KV block hashes.", env)
    add_common_flags(p, port=DEFAULT_PORT)
    p.add("--offload-threshold", default=DEFAULT_OFFLOAD_THRESHOLD, type=int,
          help="prompts larger than this many characters/tokens are prepared on a worker thread")
    p.add("--grace-s", default=10.0, type=float, help="drain grace period on SIGTERM, seconds")
    args = p.parse(argv)
    cfg = PreprocessorConfig(host=args.host, port=args.port, nats_url=args.nats_url, log_level=args.log_level,
                             metrics_port=args.metrics_port, offload_threshold=args.offload_threshold,
                             grace_s=args.grace_s)
    cfg.validate()
    return cfg
