"""Command-line flags with environment-variable twins.

Every flag ``--foo-bar`` of service ``router`` can also be set with
``MESHFRONT_ROUTER_FOO_BAR`` (Kubernetes passes config as env); the flag wins
over the env var, which wins over the default. ``--help`` shows the twin.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any


class FlagParser:
    """An argparse wrapper that gives every flag an env twin."""

    def __init__(self, service: str, description: str, env: Mapping[str, str] | None = None, *,
                 allow_abbrev: bool = True):
        self.service = service
        self._env = os.environ if env is None else env
        # allow_abbrev=False where unknown flags pass through to an engine: argparse would otherwise
        # take vLLM's --model for an abbreviation of our --model-dir.
        self._parser = argparse.ArgumentParser(prog=f"meshfront {service}", description=description,
                                               allow_abbrev=allow_abbrev)

    def env_name(self, flag: str) -> str:
        return f"MESHFRONT_{self.service.upper()}_{flag.lstrip('-').replace('-', '_').upper()}"

    def add(self, flag: str, *, default: Any = None, type: Any = str, help: str = "", choices: Sequence[Any] | None = None,
            env: str | None = None) -> None:
        """Adds ``flag``; ``env`` overrides the twin's name for flags shared by all services."""
        env_name = env or self.env_name(flag)
        if env_name in self._env:
            default = self._convert(type, self._env[env_name])
        kwargs: dict[str, Any] = {"default": default, "help": f"{help} [env {env_name}; default {default!r}]"}
        if type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = type
            if choices is not None:
                kwargs["choices"] = choices
        self._parser.add_argument(flag, **kwargs)

    @staticmethod
    def _convert(type_: Any, raw: str) -> Any:
        if type_ is bool:
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        return type_(raw)

    def parse(self, argv: Sequence[str] | None) -> argparse.Namespace:
        return self._parser.parse_args(argv)

    def parse_known(self, argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
        """Parses this parser's flags and returns the others untouched (an engine's, passed through)."""
        return self._parser.parse_known_args(argv)


def add_common_flags(p: FlagParser, *, port: int) -> None:
    """Flags every service has: where it listens, where NATS is, how it logs."""
    p.add("--host", default="127.0.0.1", help="address to listen on")
    p.add("--port", default=port, type=int, help="gRPC port (0 picks a free one)")
    p.add("--nats-url", default="nats://127.0.0.1:4222", env="MESHFRONT_NATS_URL", help="NATS server URL")
    p.add("--log-level", default="INFO", env="MESHFRONT_LOG_LEVEL", help="logging level")
    p.add("--metrics-port", default=0, type=int, help="Prometheus metrics port (0 = off)")
    # Shared env names: every pod mounts its certificate at the same path (services/common/tls.py).
    p.add("--tls-cert", default="", env="MESHFRONT_TLS_CERT",
          help="PEM certificate (serverAuth+clientAuth): serve gRPC over TLS and present it to other services")
    p.add("--tls-key", default="", env="MESHFRONT_TLS_KEY", help="PEM private key of --tls-cert")
    p.add("--tls-ca", default="", env="MESHFRONT_TLS_CA",
          help="PEM CA: require client certificates it signed and trust only it for outgoing calls (mTLS)")
