"""Gateway configuration: flags with MESHFRONT_GATEWAY_* env twins.

``--preprocessor``, ``--router`` and ``--postprocessor`` take a gRPC target (one address, a comma
list of replicas as ``ipv4:a:1,b:2``, or ``dns:///name:port``). The all-in-one shape, with the
stages in the gateway's process, is its own entry point (services/allinone) that composes these
flags with every stage's own.
"""

from __future__ import annotations

import argparse
import dataclasses
import urllib.parse
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, Flags, add_common_flags, common_errors, config_from
from services.common.namespace import DEFAULT as DEFAULT_NAMESPACE
from services.common.stage_wait import DEFAULT_WAIT_S
from services.common.targets import split_target
from services.gateway.core.nvext import MAX_STREAM_INTERVAL
from services.gateway.extensions import flags as extension_flags
from services.gateway.extensions.loading import load_factory, load_routes
from services.gateway.frontend_metrics import DEFAULT_PREFIX, check_prefix

DEFAULT_PORT = 9100
DEFAULT_RESPONSES_TTL_S = 3600
DEFAULT_MEDIA_URL_TTL_S = 3600
# The longest a generated image or video stays behind its URL (the media bucket's max age).
MAX_MEDIA_URL_TTL_S = 7 * 24 * 3600
# The chat completion field that carries reasoning (--reasoning-field-name): vLLM's and Dynamo's name, or the
# one OpenAI-compatible clients such as OpenRouter's read.
REASONING_FIELDS = ("reasoning_content", "reasoning")
MAX_BATCH_CONCURRENCY = 1024


@dataclasses.dataclass(frozen=True)
class ApiSwitches:
    """Dynamo's switches over the gateway's APIs (``add_api_switches``); the defaults are Meshfront's."""

    reasoning_field_name: str = REASONING_FIELDS[0]
    enable_anthropic_api: bool = True
    strip_anthropic_preamble: bool = True
    kserve_grpc_server: bool = True
    enable_streaming_tool_dispatch: bool = False
    enable_streaming_reasoning_dispatch: bool = False


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
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    dyn_debug_perf: bool = False  # --dyn-debug-perf, a common flag (services/common/debug_perf.py)
    # --namespace / --namespace-prefix (services/common/namespace.py): whose workers it sees, where its own
    # NATS subjects and stores live.
    namespace: str = DEFAULT_NAMESPACE
    namespace_prefix: str = ""
    # --static-model NAME=DIR and its block size (services/common/static_model.py): cards of NAME read DIR.
    static_model: str = ""
    static_model_block_size: int = 0
    # How long a stored Responses API response (and the conversation behind it) stays in NATS.
    responses_ttl_s: int = DEFAULT_RESPONSES_TTL_S
    # How long a generated image or video stays behind its URL (response_format "url").
    media_url_ttl_s: int = DEFAULT_MEDIA_URL_TTL_S
    # Where clients reach the edge (https://api.example.com): the base of media URLs; empty: the request's.
    public_url: str = ""
    metrics_prefix: str = DEFAULT_PREFIX
    # Tokens the postprocessor gathers per response unless a request says (nvext.stream_interval).
    stream_interval: int = 1
    drain_grace_s: float = 10.0
    # How long a request waits for an unreachable preprocessor, router or postprocessor (a restart).
    stage_wait_s: float = DEFAULT_WAIT_S
    # Extension code (services/gateway/extensions/): HTTP routes, and the chat engine factory's module:function.
    frontend_route_extension: tuple[str, ...] = ()
    chat_engine_factory: str = ""
    # Batch API lines one gateway replica runs at once, over all its batches (services/gateway/batch/).
    batch_max_concurrency: int = 16
    # --auth: every front door asks for an API key of the namespace's keys bucket (services/gateway/auth/).
    auth: bool = False
    # The API switches Dynamo's frontend has (docs/openai-extensions.md, "Gateway switches").
    reasoning_field_name: str = REASONING_FIELDS[0]
    enable_anthropic_api: bool = True
    strip_anthropic_preamble: bool = True
    kserve_grpc_server: bool = True
    enable_streaming_tool_dispatch: bool = False
    enable_streaming_reasoning_dispatch: bool = False

    def api_switches(self) -> ApiSwitches:
        return ApiSwitches(reasoning_field_name=self.reasoning_field_name,
                           enable_anthropic_api=self.enable_anthropic_api,
                           strip_anthropic_preamble=self.strip_anthropic_preamble,
                           kserve_grpc_server=self.kserve_grpc_server,
                           enable_streaming_tool_dispatch=self.enable_streaming_tool_dispatch,
                           enable_streaming_reasoning_dispatch=self.enable_streaming_reasoning_dispatch)

    def validate(self) -> None:
        errors = common_errors(self.port, self.drain_grace_s)
        if errors:
            raise ValueError("; ".join(errors))
        check_prefix(self.metrics_prefix)
        if self.responses_ttl_s < 1:
            # NATS per-message TTLs are whole seconds; 0 would mean "never expires" there.
            raise ValueError(f"--responses-ttl-s must be at least 1; got {self.responses_ttl_s}")
        if not 1 <= self.media_url_ttl_s <= MAX_MEDIA_URL_TTL_S:
            raise ValueError(f"--media-url-ttl-s must be 1 to {MAX_MEDIA_URL_TTL_S} (a week); "
                             f"got {self.media_url_ttl_s}")
        check_public_url(self.public_url)
        split_target(self.postprocessor)  # expanded into replicas: a dns target without a port fails at start
        if not 0 < self.stage_wait_s <= 600:
            raise ValueError(f"--stage-wait-s must be above 0 and at most 600; got {self.stage_wait_s}")
        if not 1 <= self.batch_max_concurrency <= MAX_BATCH_CONCURRENCY:
            raise ValueError(f"--batch-max-concurrency must be 1 to {MAX_BATCH_CONCURRENCY}; "
                             f"got {self.batch_max_concurrency}")
        if not 1 <= self.stream_interval <= MAX_STREAM_INTERVAL:
            raise ValueError(f"--stream-interval must be 1 to {MAX_STREAM_INTERVAL}; got {self.stream_interval}")
        # Imported, called and checked here, so that a bad extension fails the start with one line (exit 2).
        load_routes(self.frontend_route_extension)
        if self.chat_engine_factory:
            load_factory(self.chat_engine_factory)


def check_public_url(url: str) -> None:
    """Empty, or an http(s) URL with a host and no query, fragment or trailing slash."""
    if not url:
        return
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment \
            or url.endswith("/"):
        raise ValueError(f"--public-url must be http(s)://host[:port][/path] without a trailing slash; got {url!r}")


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> GatewayConfig:
    p = FlagParser("gateway", "OpenAI HTTP (through Envoy) and orchestration of the mesh.", env)
    add_common_flags(p, port=DEFAULT_PORT)
    add_flags(p)
    return from_args(p.parse(argv))


def add_flags(p: Flags) -> None:
    """The gateway's own flags (not the common ones); the all-in-one process fixes the stage targets."""
    p.add("--preprocessor", default="127.0.0.1:9200", help="preprocessor gRPC target")
    p.add("--router", default="127.0.0.1:9300", help="router gRPC target")
    p.add("--postprocessor", default="127.0.0.1:9400", help="postprocessor gRPC target")
    p.add("--stage-wait-s", default=DEFAULT_WAIT_S, type=float,
          help="seconds a request waits for an unreachable preprocessor, router or postprocessor (one restarting) "
               "before it fails with 503 (\"the router is unavailable\"); /health is 503 while one stays away "
               "this long")
    p.add("--responses-ttl-s", default=DEFAULT_RESPONSES_TTL_S, type=int,
          help="seconds a stored /v1/responses response stays retrievable and continuable (NATS KV TTL)")
    p.add("--media-url-ttl-s", default=DEFAULT_MEDIA_URL_TTL_S, type=int,
          help="seconds a generated image or video stays behind its URL (response_format url; NATS Object Store), "
               f"at most {MAX_MEDIA_URL_TTL_S}; afterwards the URL is a 404")
    p.add("--public-url", default="",
          help="the edge's address as clients reach it (https://api.example.com), the base of media URLs; "
               "unset: the scheme and host of the request")
    p.add("--stream-interval", default=1, type=int,
          help="tokens gathered into one streamed event unless a request sets nvext.stream_interval (1: every "
               "engine step as it comes; more: fewer messages and less CPU per request, coarser streaming)")
    p.add("--batch-max-concurrency", default=16, type=int,
          help="Batch API (/v1/batches) lines this gateway runs at once over all its batches, at the lowest "
               "priority: what a batch may take from interactive traffic")
    p.add("--metrics-prefix", default=DEFAULT_PREFIX, dynamo_env="DYN_METRICS_PREFIX",
          help=f"names of the request metrics (--metrics-port and /metrics at the edge): {DEFAULT_PREFIX} for "
               "ours, dynamo_frontend (or any other prefix) for Dynamo's frontend families and labels")
    p.add("--auth", default=False, type=bool,
          help="require an API key (meshfront keys create) on every API route and KServe call: 401 without one, 429 "
               "past its quotas, the 404 of an unknown model outside its models; /health, /live and /metrics stay open")
    add_api_switches(p)
    extension_flags.add_flags(p)


def add_api_switches(p: Flags) -> None:
    """Dynamo's switches over the gateway's APIs, under Dynamo's names and env twins."""
    p.add("--reasoning-field-name", default=REASONING_FIELDS[0], choices=REASONING_FIELDS,
          dynamo_env="DYN_REASONING_FIELD_NAME",
          help="the /v1/chat/completions field that carries the model's reasoning, in stream deltas and in the "
               "message")
    p.add("--enable-anthropic-api", default=True, type=bool, dynamo_env="DYN_ENABLE_ANTHROPIC_API",
          help="serve the Anthropic Messages API (/v1/messages, /v1/messages/count_tokens); off: both answer 404 "
               "in Anthropic's error shape")
    p.add("--strip-anthropic-preamble", default=True, type=bool, dynamo_env="DYN_STRIP_ANTHROPIC_PREAMBLE",
          help="drop Claude Code's billing line (x-anthropic-billing-header: ..., different in every session) from "
               "the start of a /v1/messages system prompt, so that sessions share a cacheable prompt prefix")
    p.add("--kserve-grpc-server", default=True, type=bool, dynamo_env="DYN_KSERVE_GRPC_SERVER",
          help="serve KServe v2 gRPC (inference.GRPCInferenceService) beside HTTP on the same port (Dynamo starts "
               "it instead of HTTP); off: its calls answer UNIMPLEMENTED")
    p.add("--enable-streaming-tool-dispatch", default=False, type=bool,
          dynamo_env="DYN_ENABLE_STREAMING_TOOL_DISPATCH",
          help="streamed /v1/chat/completions: an 'event: tool_call_dispatch' SSE event with each tool call once "
               "it is complete (the next call starts or the choice finishes), before the chunk that shows it so")
    p.add("--enable-streaming-reasoning-dispatch", default=False, type=bool,
          dynamo_env="DYN_ENABLE_STREAMING_REASONING_DISPATCH",
          help="streamed /v1/chat/completions: one 'event: reasoning_dispatch' SSE event per choice with the whole "
               "reasoning once it ends (content or a tool call follows, or the choice finishes)")


def from_args(args: argparse.Namespace) -> GatewayConfig:
    cfg = config_from(GatewayConfig, args)
    cfg.validate()
    return cfg
