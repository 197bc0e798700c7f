"""Gateway configuration: flags with MESHFRONT_GATEWAY_* env twins.

``--preprocessor``, ``--router`` and ``--postprocessor`` take a gRPC target
(one address, a comma list of replicas as ``ipv4:a:1,b:2``, or ``dns:///name:port``)
or ``inproc`` to run that stage inside the gateway process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, add_common_flags
from services.router.core.policies import POLICY_NAMES

DEFAULT_PORT = 9100
INPROC = "inproc"


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    host: str
    port: int
    nats_url: str
    log_level: str
    metrics_port: int
    preprocessor: str
    router: str
    postprocessor: str
    router_mode: str
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> GatewayConfig:
    p = FlagParser("gateway", "OpenAI HTTP (through Envoy) and orchestration of the mesh.", env)
    add_common_flags(p, port=DEFAULT_PORT)
    p.add("--preprocessor", default="127.0.0.1:9200", help=f"preprocessor gRPC target, or {INPROC}")
    p.add("--router", default="127.0.0.1:9300", help=f"router gRPC target, or {INPROC}")
    p.add("--postprocessor", default="127.0.0.1:9400", help=f"postprocessor gRPC target, or {INPROC}")
    p.add("--router-mode", default="round-robin", choices=POLICY_NAMES, help=f"policy when --router={INPROC}")
    return GatewayConfig(**vars(p.parse(argv)))
