"""Postprocessor configuration: flags with MESHFRONT_POSTPROCESSOR_* env twins."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, Flags, add_common_flags, common_errors, config_from
from services.common.namespace import DEFAULT as DEFAULT_NAMESPACE
from services.common.stage_wait import DEFAULT_WAIT_S
from services.common.tokenizer_files import add_trust_remote_code_flag
from services.postprocessor.core.parsers.backends import CHAT_PROCESSORS, DEFAULT_CHAT_PROCESSOR
from services.postprocessor.migration import DEFAULT_MIGRATION_LIMIT
from services.postprocessor.service import DEFAULT_IDLE_TIMEOUT_S

DEFAULT_PORT = 9400


@dataclasses.dataclass(frozen=True)
class PostprocessorConfig:
    host: str
    port: int
    nats_url: str
    log_level: str
    metrics_port: int
    drain_grace_s: float
    router: str
    migration_limit: int
    stream_idle_timeout_s: float
    chat_processor: str
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
    # How long a migration waits for an unreachable router (one restarting) before the request fails.
    router_wait_s: float = DEFAULT_WAIT_S
    migration_max_seq_len: int | None = None  # None: no limit
    # --trust-remote-code: load a tokenizer class the model directory ships. The preprocessor owns the flag;
    # this process declares it when it runs alone, and the all-in-one hands it the preprocessor's.
    trust_remote_code: bool = False
    # --enable-auto-tool-choice (vLLM's flag, as Dynamo's vLLM chat processor reads it): the model's tool calls
    # are parsed even from requests that offered no tools (tool_choice none still turns parsing off).
    enable_auto_tool_choice: bool = False

    def validate(self) -> None:
        """Raises ValueError listing every invalid setting."""
        errors = common_errors(self.port, self.drain_grace_s)
        if self.migration_limit < 0:
            errors.append(f"--migration-limit {self.migration_limit} must be >= 0")
        if self.migration_max_seq_len is not None and self.migration_max_seq_len < 1:
            errors.append(f"--migration-max-seq-len {self.migration_max_seq_len} must be >= 1 (unset: no limit)")
        if self.stream_idle_timeout_s < 0:
            errors.append(f"--stream-idle-timeout-s {self.stream_idle_timeout_s:g} must be >= 0 (0 = off)")
        if self.chat_processor not in CHAT_PROCESSORS:
            errors.append(f"--chat-processor {self.chat_processor!r} is not one of {', '.join(CHAT_PROCESSORS)}")
        if not 0 < self.router_wait_s <= 600:
            errors.append(f"--router-wait-s {self.router_wait_s} must be above 0 and at most 600")
        if errors:
            raise ValueError("; ".join(errors))


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> PostprocessorConfig:
    p = FlagParser("postprocessor", "Streams worker tokens back as text: detokenization, stop strings, usage.", env)
    add_common_flags(p, port=DEFAULT_PORT)
    add_flags(p)
    add_trust_remote_code_flag(p)
    return from_args(p.parse(argv))


def add_flags(p: Flags) -> None:
    """The postprocessor's own flags (not the common ones); the all-in-one process offers them too."""
    p.add("--router", default="127.0.0.1:9300",
          help="router gRPC target, asked for another worker when a request migrates (empty: no migration)")
    p.add("--router-wait-s", default=DEFAULT_WAIT_S, type=float,
          help="seconds a migration waits for an unreachable --router (one restarting) before the request fails")
    p.add("--stream-idle-timeout-s", default=DEFAULT_IDLE_TIMEOUT_S, type=float,
          help="silence after a worker's first tokens that counts as a frozen worker (the stream migrates; 0: off)")
    p.add("--migration-limit", default=DEFAULT_MIGRATION_LIMIT, type=int,
          help="how many times one request may move to another worker after its worker failed (0: never)",
          dynamo_env="DYN_MIGRATION_LIMIT")
    p.add("--migration-max-seq-len", default=None, type=int, dynamo_env="DYN_MIGRATION_MAX_SEQ_LEN",
          help="a request whose prompt + generated tokens exceed this is not migrated when its worker fails "
               "(it fails as without migration; counted in meshfront_postprocessor_migration_max_seq_len_exceeded"
               "_total); unset: no limit")
    p.add("--chat-processor", default=DEFAULT_CHAT_PROCESSOR,
          help=f"whose tool-call and reasoning parsers to use: {' | '.join(CHAT_PROCESSORS)} "
               "(vllm and sglang need that extra installed; see docs/parsers.md)")
    p.add("--enable-auto-tool-choice", default=False, type=bool,
          help="parse the model's tool calls (its worker's --tool-call-parser) even in requests that offered no "
               "tools, as vLLM's flag does in Dynamo's vLLM chat processor; tool_choice none still turns it off")


def from_args(args: argparse.Namespace) -> PostprocessorConfig:
    """The config from parsed flags (common and own ones); raises ValueError for invalid settings."""
    cfg = config_from(PostprocessorConfig, args)
    cfg.validate()
    return cfg
