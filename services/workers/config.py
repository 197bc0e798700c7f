"""Flags every worker kind shares: where it serves, what model it registers, how it registers."""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import socket
from pathlib import Path

from services.common.discovery import BOTH, DECODE, PREFILL
from services.common.flags import FlagParser, add_common_flags, common_errors
from services.common.hub import is_hub_id, model_flag_errors, resolve_model
from services.common.namespace import DEFAULT as DEFAULT_NAMESPACE
from services.common.namespace import Namespace
from services.common.parser_names import REASONING_PARSER_NAMES, TOOL_CALL_PARSER_NAMES
from services.workers import structural_tags
from services.workers.model_dir import read_model_info
from services.workers.structural_tags import StructuralTagSettings

AGG = "agg"
DISAGGREGATION_MODES = (PREFILL, DECODE, AGG)


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    kind: str
    model_dir: str
    model_name: str
    worker_id: str
    host: str
    port: int
    # Host other services dial; empty means --host (or this machine's name when --host is a wildcard).
    advertise_host: str
    nats_url: str
    register: bool
    log_level: str
    context_length: int
    block_size: int
    tool_call_parser: str
    reasoning_parser: str
    metrics_port: int = 0
    # Media the engine takes in chat messages ("image", "audio"), declared on the card; none by default.
    input_modalities: tuple[str, ...] = ()
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    drain_grace_s: float = 10.0
    # --disaggregation-mode: "prefill", "decode" or "agg" (Dynamo's names); registered as the card's role.
    disaggregation_mode: str = AGG
    # --namespace: the worker registers, publishes its KV events and model files in it (empty: the default).
    namespace: str = DEFAULT_NAMESPACE
    # --dyn-structural-tag and Dynamo's older flags (structural_tags.py), registered on the card.
    structural_tags: StructuralTagSettings = StructuralTagSettings()
    # --dyn-default-thinking-mode: registered on the card; "" for none.
    default_thinking_mode: str = ""
    # --no-kv-events: the engine publishes no KV events and the worker no load reports (only a kv router reads
    # them); registered on the card, so that a kv router says it sees none of this worker's cache.
    kv_events: bool = True

    @property
    def scope(self) -> Namespace:
        """The namespace it registers in (services/common/namespace.py)."""
        return Namespace.of(self.namespace)

    @property
    def role(self) -> str:
        """The card's role (services/common/discovery.py): agg is BOTH."""
        return BOTH if self.disaggregation_mode == AGG else self.disaggregation_mode

    def validate(self, *, text_model: bool = True) -> list[str]:
        """``text_model``: the model needs a directory (its tokenizer) and a context window; a media
        simulator needs neither, only a name."""
        errors = common_errors(self.port, self.drain_grace_s)
        if not self.model_dir:
            if text_model:
                errors.append("--model-dir is required")
            elif not self.model_name:
                errors.append("--model-name is required without --model-dir")
        elif not Path(self.model_dir).is_dir():
            errors.append(f"--model-dir {self.model_dir!r} is not a directory")
        elif text_model and self.context_length <= 0:
            errors.append("--context-length must be positive")
        if self.block_size <= 0:
            errors.append("--block-size must be positive")
        if "@" in self.worker_id:  # '@dp<rank>' names one data-parallel rank of a worker (common/dp_ranks.py)
            errors.append("--worker-id may not contain '@'")
        return errors

    def advertised_address(self, port: int) -> str:
        """host:port as registered for other services; ``port`` is the one actually bound."""
        host = self.advertise_host or self.host
        if host in ("0.0.0.0", "::", "[::]", ""):  # noqa: S104 - recognising a wildcard bind, not binding
            host = socket.gethostname()
        return f"{host}:{port}"


def add_worker_flags(p: FlagParser, *, engine_sized: bool = False, disaggregation: bool = False,
                     guided_tools: bool = False, kv_cache: bool = False) -> None:
    """Adds the shared worker flags (plus --host/--port/--nats-url/--log-level).

    ``engine_sized``: a real engine decides its context window and KV block size from its own
    flags (vLLM's --max-model-len and --block-size), so the worker has no flags for them.
    ``disaggregation``: the kind can run one leg of a disaggregated request (the mocker, vLLM,
    SGLang), so it offers --disaggregation-mode; the others always register as BOTH.
    ``guided_tools``: the kind enforces structural tags (vLLM, SGLang, the mocker), so it offers Dynamo's
    --dyn-structural-tag flags (structural_tags.py).
    ``kv_cache``: the kind has a prefix cache whose KV events a kv router indexes (the mocker, vLLM, SGLang), so it
    offers --no-kv-events.
    """
    add_common_flags(p, port=0, watches_workers=False)  # a worker registers in one namespace, watches none
    p.add("--model-dir", default="", help="model directory (tokenizer.json, config.json, weights)")
    p.add("--model", default="", help="a Hugging Face id (org/name) instead of --model-dir: downloaded into the "
                                       "Hugging Face cache (HF_HOME, HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE) and served "
                                       "under that name; a directory is taken as --model-dir")
    p.add("--revision", default="", help="the --model revision: a branch, tag or commit (default: the default branch)")
    p.add("--model-name", default="", help="served model name (default: the directory's name)")
    p.add("--worker-id", default="", help="id in the worker registry (default: <kind>-<8 hex>)")
    p.add("--advertise-host", default="", help="host other services dial (default: --host)")
    p.add("--register", default=True, type=bool, help="register in NATS discovery (--no-register for tests)")
    if not engine_sized:
        p.add("--context-length", default=0, type=int, help="context window (default: config.json's)")
        p.add("--block-size", default=16, type=int, help="KV block size in tokens (for routing hashes)")
    p.add("--tool-call-parser", default="", choices=("", *TOOL_CALL_PARSER_NAMES),
          help="tool-call parser name to register (e.g. hermes)")
    p.add("--reasoning-parser", default="", choices=("", *REASONING_PARSER_NAMES),
          help="reasoning parser name to register (e.g. qwen3)")
    p.add("--dyn-default-thinking-mode", default="", choices=("", "enabled", "disabled"),
          dynamo_env="DYN_DEFAULT_THINKING_MODE",
          help="the deployment's default thinking mode for chat templates (Dynamo's worker flag): a request's "
               "own thinking, reasoning_effort or chat_template_kwargs win; registered on the card")
    if guided_tools:
        structural_tags.add_flags(p)
    if kv_cache:
        p.add("--kv-events", default=True, type=bool,
              help="publish the engine's KV events and this worker's load to NATS, for kv routers "
                   "(--no-kv-events: neither, for a fleet routed round-robin, random or least-loaded, whose routers "
                   "read none; a kv router then sees no cached prefix on this worker)")
    if disaggregation:
        p.add("--disaggregation-mode", default=AGG, choices=DISAGGREGATION_MODES,
              help="prefill: only prefill legs of disaggregated requests; decode: decode legs and the requests "
                   "the router keeps aggregated; agg: whole requests (registered as the card's role)")


def worker_config_from_args(args: argparse.Namespace, kind: str, *, context_length: int | None = None,
                            block_size: int | None = None) -> WorkerConfig:
    """The shared config; an engine-sized worker passes the engine's context window and block size.

    Raises:
        ConfigError: both --model and --model-dir, or --revision without --model.
        ModelNotResolved: --model names nothing the hub (or its cache, offline) has."""
    model_dir = _model_dir(args)
    tags, errors = structural_tags.from_args(args) if "dyn_structural_tag" in args else (StructuralTagSettings(), [])
    if errors:
        raise ConfigError(errors)
    context = args.context_length if context_length is None else context_length
    if context <= 0 and model_dir and Path(model_dir).is_dir():
        context = read_model_info(model_dir).context_length
    return WorkerConfig(
        kind=kind,
        model_dir=model_dir,
        model_name=args.model_name or (args.model if is_hub_id(args.model) else "") or (Path(model_dir).name
                                                                                       if model_dir else ""),
        worker_id=args.worker_id or f"{kind}-{secrets.token_hex(4)}",
        host=args.host,
        port=args.port,
        advertise_host=args.advertise_host,
        nats_url=args.nats_url,
        register=args.register,
        log_level=args.log_level,
        context_length=context,
        block_size=args.block_size if block_size is None else block_size,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        metrics_port=args.metrics_port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        drain_grace_s=args.drain_grace_s,
        # Kinds without the flag (add_worker_flags(disaggregation=False)) run whole requests.
        disaggregation_mode=args.disaggregation_mode if "disaggregation_mode" in args else AGG,
        namespace=args.namespace,
        structural_tags=tags,
        default_thinking_mode=args.dyn_default_thinking_mode,
        kv_events=args.kv_events if "kv_events" in args else False,  # kinds without a KV cache publish none
    )


def _model_dir(args: argparse.Namespace) -> str:
    """--model-dir, or the directory --model names (a Hugging Face snapshot, downloaded when not cached)."""
    errors = model_flag_errors(args.model, args.model_dir, args.revision)
    if errors:
        raise ConfigError(errors)
    if not args.model:
        return str(args.model_dir)
    if Path(args.model).is_dir():  # vllm serve's --model takes a directory too
        return str(args.model)
    return resolve_model(args.model, args.revision)


class ConfigError(ValueError):
    """Every problem found in a worker's flags, reported together at startup."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors
