"""All-in-one configuration: the common flags once, then every stage's own flags with its env twins.

``--host``, ``--port`` (the gateway's gRPC port), ``--nats-url``, ``--log-level``, ``--metrics-port``,
``--drain-grace-s``, ``--tls-*`` and ``--namespace`` / ``--namespace-prefix`` exist once (env
``MESHFRONT_ALLINONE_HOST``, ``_PORT``, ``_METRICS_PORT``, ``_DRAIN_GRACE_S``, and the shared
``MESHFRONT_NATS_URL``, ``MESHFRONT_LOG_LEVEL``, ``MESHFRONT_TLS_*``, ``MESHFRONT_NAMESPACE``). Every other
flag is a stage's own, added by that stage's ``add_flags`` and parsed by its ``from_args``, with the stage's
env twin
(``--kv-overlap-weight`` is also ``MESHFRONT_ROUTER_KV_OVERLAP_WEIGHT``), so a flag added to a stage
appears here without an edit. Two stages defining one flag name fails at parser construction
(``FlagCollision``) unless ``FIXED`` below resolves it. The resolutions:

- ``--router``: the gateway's router target and the postprocessor's (asked for another worker when a
  request migrates). Both are the in-process router here; neither flag is offered.
- ``--preprocessor``, ``--postprocessor`` (gateway targets) and the waits
  for a restarting stage (``--stage-wait-s``, the postprocessor's ``--router-wait-s``): in-process; not offered.
- ``--router-mode``: the router's own. (The gateway used to copy it for its in-process router; it no
  longer has it.)
- ``--chat-processor``: the postprocessor's (whose output parsers). The preprocessor process's flag of
  that name (whose renderer) is not offered: the all-in-one's preprocessor renders with ours, since an
  engine's renderer runs from the engine's environment (services/preprocessor/config.py).
- ``--drain-grace-s`` is a common flag (every process has one gRPC server and one drain grace), so it
  exists once here too (env ``MESHFRONT_ALLINONE_DRAIN_GRACE_S``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.flags import FlagParser, add_common_flags
from services.common.stage_wait import DEFAULT_WAIT_S
from services.gateway import config as gateway_config
from services.postprocessor import config as postprocessor_config
from services.preprocessor import config as preprocessor_config
from services.router import config as router_config

DEFAULT_PORT = gateway_config.DEFAULT_PORT
_IN_PROCESS = "the all-in-one process runs this stage in-process; it takes no gRPC target"

# Stage name -> its config module (add_flags, from_args), in the order the flags appear in --help.
STAGES = {"gateway": gateway_config, "preprocessor": preprocessor_config, "router": router_config,
          "postprocessor": postprocessor_config}
# Stage -> flag -> (the value this process fixes, why giving the flag is an error).
FIXED: dict[str, dict[str, tuple[Any, str]]] = {
    "gateway": {"--preprocessor": ("", _IN_PROCESS), "--router": ("", _IN_PROCESS),
                "--postprocessor": ("", _IN_PROCESS),
                "--stage-wait-s": (DEFAULT_WAIT_S, _IN_PROCESS)},
    "postprocessor": {"--router": ("", "migrations ask the all-in-one's in-process router"),
                      "--router-wait-s": (DEFAULT_WAIT_S, "migrations ask the all-in-one's in-process router")},
}


@dataclasses.dataclass(frozen=True)
class AllInOneConfig:
    gateway: gateway_config.GatewayConfig
    preprocessor: preprocessor_config.PreprocessorConfig
    router: router_config.RouterConfig
    postprocessor: postprocessor_config.PostprocessorConfig

    # The common flags, the same in every stage's config.
    @property
    def host(self) -> str:
        return self.gateway.host

    @property
    def port(self) -> int:
        return self.gateway.port

    @property
    def nats_url(self) -> str:
        return self.gateway.nats_url

    @property
    def log_level(self) -> str:
        return self.gateway.log_level

    @property
    def metrics_port(self) -> int:
        return self.gateway.metrics_port

    @property
    def drain_grace_s(self) -> float:
        return self.gateway.drain_grace_s

    # What services/common/service_main.py reads of every config (TLS is the gateway's: it serves).
    @property
    def tls_cert(self) -> str:
        return self.gateway.tls_cert

    @property
    def tls_key(self) -> str:
        return self.gateway.tls_key

    @property
    def tls_ca(self) -> str:
        return self.gateway.tls_ca

    @property
    def dyn_debug_perf(self) -> bool:
        return self.gateway.dyn_debug_perf

    # One --namespace and --namespace-prefix (common flags) for every stage.
    @property
    def namespace(self) -> str:
        return self.gateway.namespace

    @property
    def namespace_prefix(self) -> str:
        return self.gateway.namespace_prefix

    @property
    def static_model(self) -> str:
        return self.gateway.static_model

    @property
    def static_model_block_size(self) -> int:
        return self.gateway.static_model_block_size


def parser(env: Mapping[str, str] | None = None) -> FlagParser:
    p = FlagParser("allinone", "The gateway with the preprocessor, router and postprocessor in its process; "
                   "every stage's flags.", env, allow_abbrev=False)  # no abbreviations: stage flags share prefixes
    add_common_flags(p, port=DEFAULT_PORT)
    for name, module in STAGES.items():
        module.add_flags(p.stage(name, FIXED.get(name)))
    return p


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> AllInOneConfig:
    """Raises ValueError for an invalid stage setting (argparse exits for an unknown or refused flag)."""
    args = parser(env).parse(argv)
    return AllInOneConfig(gateway=gateway_config.from_args(args), preprocessor=preprocessor_config.from_args(args),
                          router=router_config.from_args(args), postprocessor=postprocessor_config.from_args(args))
