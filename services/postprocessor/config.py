"""Postprocessor configuration: flags with MESHFRONT_POSTPROCESSOR_* env twins."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, add_common_flags

DEFAULT_PORT = 9400


@dataclasses.dataclass(frozen=True)
class PostprocessorConfig:
    host: str
    port: int
    nats_url: str
    log_level: str
    metrics_port: int
    drain_grace_s: float

    def validate(self) -> None:
        """Raises ValueError listing every invalid setting."""
        errors = []
        if not 0 <= self.port <= 65535:
            errors.append(f"--port {self.port} is not a port number")
        if self.drain_grace_s < 0:
            errors.append(f"--drain-grace-s {self.drain_grace_s} must be >= 0")
        if errors:
            raise ValueError("; ".join(errors))


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> PostprocessorConfig:
    p = FlagParser("postprocessor", "Streams worker tokens back as text: detokenization, stop strings, usage.", env)
    add_common_flags(p, port=DEFAULT_PORT)
    p.add("--drain-grace-s", default=10.0, type=float, help="seconds in-flight streams get to finish on SIGTERM")
    cfg = PostprocessorConfig(**vars(p.parse(argv)))
    cfg.validate()
    return cfg
