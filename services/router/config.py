"""Router configuration: flags with MESHFRONT_ROUTER_* env twins."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, add_common_flags
from services.router.core.policies import POLICY_NAMES

DEFAULT_PORT = 9300


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    host: str
    port: int
    nats_url: str
    log_level: str
    metrics_port: int
    router_mode: str


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> RouterConfig:
    p = FlagParser("router", "Chooses a worker for each request.", env)
    add_common_flags(p, port=DEFAULT_PORT)
    p.add("--router-mode", default="round-robin", choices=POLICY_NAMES, help="routing policy")
    return RouterConfig(**vars(p.parse(argv)))
