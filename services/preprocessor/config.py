"""Preprocessor configuration: flags with MESHFRONT_PREPROCESSOR_* env twins."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, Flags, add_common_flags, common_errors
from services.common.namespace import DEFAULT as DEFAULT_NAMESPACE
from services.common.tokenizer_files import TOKENIZER_BACKENDS, TokenizerOptions, add_trust_remote_code_flag
from services.preprocessor.core.renderers import CHAT_PROCESSORS, DEFAULT_CHAT_PROCESSOR, DEFAULT_PREFIX_CACHE_BYTES
from services.preprocessor.core.template_check import read_chat_template
from services.preprocessor.media.limits import MediaLimits
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
    drain_grace_s: float = 10.0
    # Chat template kwargs every request starts from, e.g. {"enable_thinking": false}.
    default_chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    hide_tools_for_tool_choice_none: bool = True
    # --chat-template's source, which replaces every model directory's template.
    chat_template: str = ""
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
    # Bounds on fetching and decoding chat media (--media-*).
    media: MediaLimits = MediaLimits()
    # Who renders and tokenizes chats: ours, or an engine's own renderer (services/preprocessor/core/renderers).
    chat_processor: str = DEFAULT_CHAT_PROCESSOR
    # How model tokenizers load (services/common/tokenizer_files.py): --tokenizer, --tokenizer-fallback and
    # --trust-remote-code, Dynamo's flags.
    tokenizer: TokenizerOptions = TokenizerOptions()
    # Bytes of recent prompts' text and ids kept so a conversation's next turn encodes only its new part
    # (core/prefix_cache.py); 0: off.
    tokenizer_prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES

    def validate(self) -> None:
        errors = common_errors(self.port, self.drain_grace_s) + self.media.errors()
        if self.tokenizer_prefix_cache_bytes < 0:
            errors.append("--tokenizer-prefix-cache-bytes must be >= 0 (0: no prefix cache)")
        if self.offload_threshold < 0:
            errors.append("--offload-threshold must be >= 0")
        if self.chat_processor not in CHAT_PROCESSORS:
            errors.append(f"--chat-processor {self.chat_processor!r} is not one of {', '.join(CHAT_PROCESSORS)} "
                          "(the preprocessor's)")
        if self.tokenizer.backend not in TOKENIZER_BACKENDS:
            errors.append(f"--tokenizer {self.tokenizer.backend!r} is not one of {', '.join(TOKENIZER_BACKENDS)}")
        if errors:
            raise ValueError("; ".join(errors))


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> PreprocessorConfig:
    p = FlagParser("preprocessor", "Chat templates, tokenization and KV block hashes.", env)
    add_common_flags(p, port=DEFAULT_PORT)
    add_flags(p)
    add_chat_processor_flag(p)
    args = p.parse(argv)
    cfg = dataclasses.replace(from_args(args), chat_processor=args.chat_processor)
    cfg.validate()
    return cfg


def add_chat_processor_flag(p: Flags) -> None:
    """The preprocessor process's --chat-processor. Not in ``add_flags``: the all-in-one process's flag of
    that name is the postprocessor's, and its preprocessor renders with ours (an engine's renderer needs
    the engine's environment, where the preprocessor runs as its own process)."""
    p.add("--chat-processor", default=DEFAULT_CHAT_PROCESSOR,
          help=f"who renders and tokenizes chat prompts: {' | '.join(CHAT_PROCESSORS)} (vllm / sglang: the "
               "engine's own renderer; the preprocessor must run from the engine's environment, as meshfront "
               "run starts it; see docs/parsers.md)")


def add_flags(p: Flags) -> None:
    """The preprocessor's own flags (not the common ones); the all-in-one process offers them too."""
    p.add("--offload-threshold", default=DEFAULT_OFFLOAD_THRESHOLD, type=int,
          help="prompts larger than this many characters/tokens are prepared on a worker thread")
    p.add("--default-chat-template-kwargs", default="",
          help='JSON object of chat template kwargs under every request\'s own, e.g. \'{"enable_thinking": false}\' '
               "for a deployment whose default thinking mode is off")
    p.add("--hide-tools-for-tool-choice-none", default=True, type=bool,
          aliases=("--exclude-tools-when-tool-choice-none",), dynamo_env="DYN_EXCLUDE_TOOLS_WHEN_TOOL_CHOICE_NONE",
          help="tool_choice none hides the tools from the chat template (Dynamo's default)")
    p.add("--chat-template", default="",
          help="Jinja chat template file used instead of the model directory's (every model this "
               "preprocessor serves); checked at start")
    d = MediaLimits()
    p.add("--media-max-bytes", default=d.max_bytes, type=int,
          help="most bytes of one image, video or audio item, fetched or inline (larger: 400)")
    p.add("--media-max-items", default=d.max_items, type=int, help="most media parts in one request (more: 400)")
    p.add("--media-fetch-timeout-s", default=d.timeout_s, type=float,
          help="seconds one media URL may take to fetch, redirects included (longer: 400)")
    p.add("--media-max-redirects", default=d.max_redirects, type=int,
          help="redirects one media fetch follows (more: 400)")
    p.add("--media-allow-private-urls", default=False, type=bool,
          help="fetch media URLs whose host resolves to a private, loopback, link-local or other non-global "
               "address (default: refused with a 400)")
    p.add("--media-uuid-cache-bytes", default=d.uuid_cache_bytes, type=int,
          help="bytes of recent media kept for parts that name only a uuid (0: none)")
    p.add("--media-uuid-store-bytes", default=d.uuid_store_bytes, type=int,
          help="bytes of media sent with a uuid kept in NATS for every preprocessor replica, oldest dropped "
               "first (0: not shared); set by the replica that creates the stream")
    p.add("--media-uuid-ttl-s", default=d.uuid_ttl_s, type=float,
          help="seconds media sent with a uuid stays in the shared NATS store")
    p.add("--media-max-audio-s", default=d.max_audio_s, type=float,
          help="longest input_audio clip decoded, in seconds (longer: 400)")
    add_tokenizer_flags(p)
    # Dynamo 1.6.1's frontend has no flag for its tokenizer cache: this one is Meshfront's.
    p.add("--tokenizer-prefix-cache-bytes", default=DEFAULT_PREFIX_CACHE_BYTES, type=int,
          help="bytes of recent chat prompts (text and token ids) kept per preprocessor so that a conversation's "
               "next turn tokenizes only what it adds, with the same ids (0: off)")


def add_tokenizer_flags(p: Flags) -> None:
    """Dynamo's tokenizer flags. The preprocessor owns them; the postprocessor process declares
    --trust-remote-code too (it loads the same tokenizers), and in the all-in-one reads this one."""
    p.add("--tokenizer", default="default", choices=TOKENIZER_BACKENDS, dynamo_env="DYN_TOKENIZER",
          help="what encodes prompts: default = the tokenizers library; fastokens = fastokens (Rust BPE "
               "encoding; tokenizers still decodes)")
    p.add("--tokenizer-fallback", default=True, type=bool, dynamo_env="DYN_TOKENIZER_FALLBACK",
          help="with --tokenizer fastokens, encode with tokenizers (logged) when fastokens cannot load a model's "
               "tokenizer; --no-tokenizer-fallback fails that model instead")
    add_trust_remote_code_flag(p)


def from_args(args: argparse.Namespace) -> PreprocessorConfig:
    """The config from parsed flags (common and own ones); raises ValueError for invalid settings."""
    defaults = _json_object(args.default_chat_template_kwargs, "--default-chat-template-kwargs")
    template = read_chat_template(args.chat_template)
    cfg = PreprocessorConfig(host=args.host, port=args.port, nats_url=args.nats_url, log_level=args.log_level,
                             metrics_port=args.metrics_port, offload_threshold=args.offload_threshold,
                             drain_grace_s=args.drain_grace_s, default_chat_template_kwargs=defaults,
                             hide_tools_for_tool_choice_none=args.hide_tools_for_tool_choice_none,
                             chat_template=template,
                             tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
                             dyn_debug_perf=args.dyn_debug_perf,
                             namespace=args.namespace, namespace_prefix=args.namespace_prefix,
                             static_model=args.static_model, static_model_block_size=args.static_model_block_size,
                             media=MediaLimits(max_bytes=args.media_max_bytes, max_items=args.media_max_items,
                                               timeout_s=args.media_fetch_timeout_s,
                                               max_redirects=args.media_max_redirects,
                                               allow_private=args.media_allow_private_urls,
                                               uuid_cache_bytes=args.media_uuid_cache_bytes,
                                               uuid_store_bytes=args.media_uuid_store_bytes,
                                               uuid_ttl_s=args.media_uuid_ttl_s,
                                               max_audio_s=args.media_max_audio_s),
                             tokenizer=TokenizerOptions(backend=args.tokenizer, fallback=args.tokenizer_fallback,
                                                        trust_remote_code=args.trust_remote_code),
                             tokenizer_prefix_cache_bytes=args.tokenizer_prefix_cache_bytes)
    cfg.validate()
    return cfg


def _json_object(raw: str, flag: str) -> dict:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object")  # noqa: TRY004 - a flag error, reported as usage
    return value
