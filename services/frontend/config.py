"""``meshfront frontend``'s configuration: Dynamo's flags and ``DYN_*`` twins over every stage's own flags.

One parser holds:

- the common flags (services/common/flags.py) and every stage's flags, composed as the all-in-one process
  composes them (services/allinone/config.py). Each stage declares the Dynamo spelling and env twin of the
  flags it owns (``--router-mode``/``DYN_ROUTER_MODE`` is the router's), so the split services accept the
  same names;
- this command's own flags: the edge (``--http-host``, ``--http-port``, ``--tls-*-path``), the shape
  (``--split``, ``--dyn-preprocess-workers``), ``-i``, ``--version``, ``--check-config``, ``--dump-config-to``,
  ``--model-name`` (the model ``-i`` chats with) and the flags that only say how to map others;
- every refused Dynamo flag (services/frontend/refusals.py), under all its spellings and env twin.

Under this command a flag's default is Dynamo's (``DYNAMO_DEFAULTS``: migration off, the Anthropic API and
KServe off, Dynamo's metric names), so a Dynamo launch line means what it meant. Each resolved value
remembers where it came from (default, ``env NAME`` or flag): ``--check-config`` prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from typing import Any

from services.allinone.config import FIXED, STAGES
from services.common.flags import FlagParser, add_common_flags
from services.frontend.dynamo_help import DYNAMO_VERSION, dynamo_flags
from services.frontend.refusals import REFUSED, REFUSED_VALUES, refusal_line
from services.launcher import edge

PROG = "meshfront frontend"
# Dynamo's defaults where the stages' own differ. Meshfront alone serves everything it can; a Dynamo frontend
# serves only what its flags turn on, and retries nothing unless told.
DYNAMO_DEFAULTS: dict[str, Any] = {
    "--migration-limit": 0,
    "--router-replica-sync": False,
    "--enable-anthropic-api": False,
    "--kserve-grpc-server": False,
    "--metrics-prefix": "dynamo_frontend",
    "--router-session-affinity-mode": "hard",
    "--router-track-output-blocks": False,
}
# A stage's flag another stage's own process also takes (the postprocessor loads the same tokenizers).
ALSO_READ_BY: dict[str, tuple[str, ...]] = {"--trust-remote-code": ("postprocessor",)}
# Common flags the plan sets per process (ports); every other common flag goes to every process.
PLACED_BY_PLAN = ("--host", "--port", "--metrics-port")
FRONTEND = "frontend"
# --dyn-chat-processor's values -> the stages' --chat-processor ("dynamo" is Dynamo's own Rust processor:
# here, Meshfront's own).
CHAT_PROCESSORS = {"dynamo": "ours", "vllm": "vllm", "sglang": "sglang"}


class ConfigError(ValueError):
    """A bad value or combination: one line, exit status 2."""


def version() -> str:
    return f"{PROG} {importlib.metadata.version('meshfront')} (Dynamo {DYNAMO_VERSION} flags)"


def _model_name(value: str) -> str:
    """Dynamo's validate_model_name: a non-empty name, stripped."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"model-name must be a non-empty string, got: {value!r}")
    return value.strip()


def _model_path(value: str) -> str:
    """Dynamo's validate_model_path: an existing directory."""
    if not os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"model-path must be a valid directory on disk, got: {value}")
    return os.path.abspath(value)


def _frontend_flags(p: FlagParser) -> None:
    """This command's own flags (Dynamo's spellings and env twins where Dynamo has them)."""
    p.add("--interactive", default=False, type=bool, aliases=("-i",), dynamo_env="DYN_INTERACTIVE",
          help="a text chat on this terminal with the first chat model (or --model-name) instead of a server")
    p.add("--http-host", default="0.0.0.0", dynamo_env="DYN_HTTP_HOST",  # noqa: S104 - Dynamo's default
          help="address Envoy listens on (HTTP, SSE and KServe gRPC on one port)")
    p.add("--http-port", default=8000, type=int, dynamo_env="DYN_HTTP_PORT", help="Envoy's port")
    p.add("--tls-cert-path", default="", dynamo_env="DYN_TLS_CERT_PATH", help="PEM certificate: Envoy serves TLS")
    p.add("--tls-key-path", default="", dynamo_env="DYN_TLS_KEY_PATH", help="PEM key of --tls-cert-path")
    p.add("--tls-client-ca-cert-path", default="", dynamo_env="DYN_TLS_CLIENT_CA_CERT_PATH",
          help="PEM CA: Envoy requires client certificates it signed (mTLS at the edge)")
    p.add("--grpc-metrics-port", default=8788, type=int, dynamo_env="DYN_GRPC_METRICS_PORT",
          help="with --kserve-grpc-server: the Prometheus port of the frontend process (0 = off), as Dynamo's "
               "KServe mode serves /metrics on it")
    p.add("--dump-config-to", default="", dynamo_env="DYN_DUMP_CONFIG_TO",
          help="write the resolved configuration (JSON: each setting's value and source) here, then serve")
    p.add("--check-config", default=False, type=bool,
          help="print the resolved configuration (each setting's value and where it came from) and exit 0")
    p.add("--model-name", default=None, type=_model_name, dynamo_env="DYN_MODEL_NAME",
          help="a static model's name (with --model-path); with -i, the model to chat with (default: the first "
               "listed)")
    p.add("--model-path", default=None, type=_model_path, dynamo_env="DYN_MODEL_PATH",
          help="a static model: --model-name's cards read their tokenizer, chat template and config from this "
               "directory, not from what the workers published (they need publish nothing): --static-model")
    p.add("--kv-cache-block-size", default=0, type=int, dynamo_env="DYN_KV_CACHE_BLOCK_SIZE",
          help="the static model's KV block size for routing (default: its workers' cards'): "
               "--static-model-block-size")
    p.add("--dyn-chat-processor", default="dynamo", choices=tuple(CHAT_PROCESSORS), dynamo_env="DYN_CHAT_PROCESSOR",
          help="whose renderer and parsers: dynamo = Meshfront's own; vllm or sglang run from that engine's "
               "environment (implies --split)")
    p.add("--dyn-preprocess-workers", default=0, type=int, dynamo_env="DYN_PREPROCESS_WORKERS",
          help="tokenizing and rendering in N processes of their own: N preprocessor replicas (implies --split); "
               "0 keeps them in the frontend process")
    p.add("--split", default=False, type=bool,
          help="run the gateway, preprocessor, router and postprocessor as processes of their own "
               "(default: Envoy and one all-in-one process)")


def _refused_flags(p: FlagParser) -> None:
    """Every refused Dynamo flag, under its spellings and env twin, so it can be refused with its reason."""
    by_flag = {f.flag: f for f in dynamo_flags()}
    for flag, refusal in REFUSED.items():
        dynamo = by_flag[flag]
        boolean = not dynamo.takes_value
        p.add(flag, default=None, type=bool if boolean else str, aliases=dynamo.aliases, dynamo_env=dynamo.env,
              help=f"refused: {refusal.why}; instead: {refusal.instead}", owner=f"refused:{flag}")


def parser(env: Mapping[str, str] | None = None) -> FlagParser:
    p = FlagParser(FRONTEND, "Dynamo's `python -m dynamo.frontend`, as Meshfront: Envoy and the frontend stages "
                   "against the NATS its workers registered in. Every flag of Dynamo "
                   f"{DYNAMO_VERSION} is honoured or refused with a reason (docs/dynamo-flags.md).", env,
                   allow_abbrev=False, default_overrides=DYNAMO_DEFAULTS)
    p.add_version(version())
    add_common_flags(p, port=0)
    for name, module in STAGES.items():
        module.add_flags(p.stage(name, FIXED.get(name)))
    _frontend_flags(p)
    _refused_flags(p)
    return p


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str  # the argparse dest: Dynamo's name for its flags (http_port, router_mode, ...)
    flag: str
    owner: str  # "frontend" (this command and the common flags) or the stage that owns it
    value: Any
    source: str  # "default", "env NAME" or "flag"


@dataclasses.dataclass(frozen=True)
class FrontendConfig:
    args: argparse.Namespace
    settings: dict[str, Setting]  # by name, honoured flags only, in the parser's order

    def __getattr__(self, name: str) -> Any:
        # Only called for names that are not fields: a setting's value (cfg.http_port).
        settings = self.__dict__["settings"]
        if name not in settings:
            raise AttributeError(name)
        return settings[name].value

    def stage_argv(self, stage: str) -> list[str]:
        """The flags to give ``stage``'s process (or the all-in-one's, for stage "allinone"): every setting it
        owns whose value is not its own default (given, from env, or Dynamo's default here), and the common
        flags the plan does not place."""
        owners = set(STAGES) if stage == "allinone" else {stage}
        out: list[str] = []
        for s in self.settings.values():
            common = s.owner == FRONTEND and s.name in _COMMON_NAMES
            shared = stage in ALSO_READ_BY.get(s.flag, ())
            if not (common or shared or s.owner in owners) or (s.source == "default" and s.flag not in DYNAMO_DEFAULTS):
                continue
            out += _argv(s.flag, s.value)
        if self.settings["model_path"].value:  # Dynamo's static model, in the stages' own terms
            out += [f"--static-model={self.settings['model_name'].value}={self.settings['model_path'].value}",
                    f"--static-model-block-size={self.settings['kv_cache_block_size'].value}"]
        return out


def _argv(flag: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [flag if value else f"--no-{flag[2:]}"]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in (flag, str(v))]
    return [] if value is None else [f"{flag}={value}"]


def _common_names() -> frozenset[str]:
    probe = FlagParser("probe", "", {})
    add_common_flags(probe, port=0)
    return frozenset(f.lstrip("-").replace("-", "_") for f in probe.owners if f not in PLACED_BY_PLAN)


_COMMON_NAMES = _common_names()


def parse(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> FrontendConfig:
    """Parses and checks ``argv`` and the env twins. Raises ConfigError (one line) for a refused flag or value, a
    bad combination or a bad stage setting; argparse exits 2 itself for an unknown flag or a bad type."""
    env = os.environ if env is None else env
    _refuse_values(argv or [], env)
    p = parser(env)
    args = p.parse(argv)
    settings: dict[str, Setting] = {}
    for action in p.actions():
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        flag = next(s for s in action.option_strings if s.startswith("--") and not s.startswith("--no-"))
        owner = p.owners.get(flag, "")
        value = getattr(args, action.dest)
        source = p.sources.get(action.dest, "default")
        if owner.startswith("refused:"):
            if source != "default":
                _refuse(flag, value)
            continue
        if owner.startswith("fixed:"):
            continue
        settings[action.dest] = Setting(action.dest, flag, owner, value, source)
    cfg = FrontendConfig(args, settings)
    _check(cfg)
    return cfg


def _refuse_values(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """A refused value of an honoured flag, on the command line or in its Dynamo env twin: refused with its
    reason before argparse would call it merely an invalid choice."""
    twins = {f.flag: f.env for f in dynamo_flags() if f.flag in REFUSED_VALUES}
    for flag, refused in REFUSED_VALUES.items():
        given = [env.get(twins[flag], "")]
        given += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
        given += [a.split("=", 1)[1] for a in argv if a.startswith(f"{flag}=")]
        for value in given:
            if value in refused:
                raise ConfigError(f"{flag} {value}: not supported by Meshfront: {refused[value]}")


def _refuse(flag: str, value: Any) -> None:
    text = str(value)
    if text not in REFUSED[flag].accepts:
        raise ConfigError(refusal_line(flag, REFUSED[flag], text))


def _check(cfg: FrontendConfig) -> None:
    """Values and combinations no single stage can judge, then every stage's own checks."""
    _check_edge(cfg)
    _check_static_model(cfg)
    if cfg.dyn_preprocess_workers < 0:
        raise ConfigError(f"--dyn-preprocess-workers {cfg.dyn_preprocess_workers} must be >= 0")
    if cfg.interactive and cfg.kserve_grpc_server:
        raise ConfigError("--interactive and --kserve-grpc-server are different modes: choose one")
    for name, module in STAGES.items():
        try:
            module.from_args(cfg.args)
        except ValueError as e:
            raise ConfigError(f"{name}: {e}") from e


def _check_edge(cfg: FrontendConfig) -> None:
    """Envoy's listener: TLS files in pairs and readable, ports, the host."""
    if bool(cfg.tls_cert_path) != bool(cfg.tls_key_path):
        raise ConfigError("--tls-cert-path and --tls-key-path must be provided together")
    if cfg.tls_client_ca_cert_path and not cfg.tls_cert_path:
        raise ConfigError("--tls-client-ca-cert-path requires --tls-cert-path and --tls-key-path")
    for path_flag in ("tls_cert_path", "tls_key_path", "tls_client_ca_cert_path"):
        path = getattr(cfg, path_flag)
        if path and not os.path.isfile(path):
            raise ConfigError(f"--{path_flag.replace('_', '-')} {path}: not a file")
    if not 0 <= cfg.http_port <= 65535 or not 0 <= cfg.grpc_metrics_port <= 65535:
        raise ConfigError("--http-port and --grpc-metrics-port must be port numbers (0..65535)")
    _check_host(cfg.http_host)


def _check_static_model(cfg: FrontendConfig) -> None:
    if cfg.model_path and not cfg.model_name:
        raise ConfigError("--model-path needs --model-name: the name its workers register and it is served under")
    if cfg.kv_cache_block_size and not cfg.model_path:
        raise ConfigError("--kv-cache-block-size sets the static model's block size: it needs --model-path "
                          "(discovered workers' cards carry their own)")
    if cfg.kv_cache_block_size < 0:
        raise ConfigError(f"--kv-cache-block-size {cfg.kv_cache_block_size} must be >= 0")
    if cfg.model_path and cfg.static_model:
        raise ConfigError("--model-path and --static-model say the same thing: give one")


def _check_host(host: str) -> None:
    try:
        edge.check_host(host)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def describe(cfg: FrontendConfig) -> str:
    """The resolved configuration, one setting a line: ``name = value  (source)``, the frontend's first."""
    width = max(len(n) for n in cfg.settings)
    lines = [f"# {version()}: resolved configuration (source: default, env NAME or flag)"]
    for owner in (FRONTEND, *STAGES):
        rows = [s for s in cfg.settings.values() if s.owner == owner]
        if rows:
            lines.append(f"# {owner}")
            lines += [f"{s.name:<{width}} = {s.value!r}  ({s.source})" for s in rows]
    return "\n".join(lines)


def as_json(cfg: FrontendConfig) -> dict[str, Any]:
    return {"version": version(), "settings": {
        s.name: {"value": s.value, "source": s.source, "flag": s.flag, "owner": s.owner}
        for s in cfg.settings.values()}}
