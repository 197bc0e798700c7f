"""Command-line flags with environment-variable twins.

Every flag ``--foo-bar`` of service ``router`` can also be set with
``MESHFRONT_ROUTER_FOO_BAR`` (Kubernetes passes config as env); the flag wins
over the env var, which wins over the default. ``--help`` shows the twin.

A parser may compose several services' flags (the all-in-one process: services/allinone):
``stage(service)`` hands a service's ``add_flags`` a view that keeps that service's env twins and
group in ``--help``. A flag name that two services define is an error unless the composition
resolves it explicitly (``fixed``: the flag is not offered, its value is set).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


class FlagCollision(ValueError):
    """Two services of one composed parser define the same flag, and nobody said which one wins."""


class Flags(Protocol):
    """What a service's ``add_flags`` needs: a ``FlagParser`` or one stage of a composed one."""

    def add(self, flag: str, *, default: Any = None, type: Any = str, help: str = "",
            choices: Sequence[Any] | None = None, env: str | None = None) -> None: ...


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
        self.owners: dict[str, str] = {}  # flag -> the service that defined it
        self._groups: dict[str, Any] = {}

    def env_name(self, flag: str) -> str:
        return f"MESHFRONT_{self.service.upper()}_{flag.lstrip('-').replace('-', '_').upper()}"

    def add(self, flag: str, *, default: Any = None, type: Any = str, help: str = "",
            choices: Sequence[Any] | None = None, env: str | None = None, owner: str = "") -> None:
        """Adds ``flag``; ``env`` overrides the twin's name for flags shared by all services."""
        owner = owner or self.service
        if flag in self.owners:
            raise FlagCollision(f"{flag} of {owner} collides with {flag} of {self.owners[flag]}: resolve it "
                                "explicitly where the services are composed")
        self.owners[flag] = owner
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
        self._target(owner).add_argument(flag, **kwargs)

    def _target(self, owner: str) -> Any:
        if owner == self.service:
            return self._parser
        if owner not in self._groups:
            self._groups[owner] = self._parser.add_argument_group(f"{owner} flags")
        return self._groups[owner]

    def stage(self, service: str, fixed: Mapping[str, Any] | None = None) -> StageFlags:
        """The flags of ``service`` inside this (composed) parser; see ``StageFlags``."""
        return StageFlags(self, service, fixed or {})

    def fix(self, flag: str, value: Any, owner: str, why: str) -> None:
        """``flag`` is not offered: its value is ``value``, and giving it is an error that says ``why``."""
        prior = self.owners.get(flag)
        if prior is not None and not prior.startswith("fixed:"):
            raise FlagCollision(f"{flag} of {owner} is fixed here but {prior} offers it")
        self.owners[flag] = f"fixed:{owner}"
        self._parser.set_defaults(**{_dest(flag): value})
        if prior is None:
            self._parser.add_argument(flag, action=_Refused, why=why, help=argparse.SUPPRESS,
                                      default=argparse.SUPPRESS)

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


class StageFlags:
    """One service's flags inside a parser that composes several services' flags.

    Each flag keeps that service's env twin (``MESHFRONT_<SERVICE>_*``, so one deployment's env
    configures the stage in either shape) and its own group in ``--help``. A flag in ``fixed`` is not
    offered: the composition sets its value (e.g. a stage's gRPC target, where the stage runs in-process).
    """

    def __init__(self, parser: FlagParser, service: str, fixed: Mapping[str, tuple[Any, str]]):
        self.parser = parser
        self.service = service
        self._fixed = fixed
        self.offered: list[str] = []

    def env_name(self, flag: str) -> str:
        return f"MESHFRONT_{self.service.upper()}_{flag.lstrip('-').replace('-', '_').upper()}"

    def add(self, flag: str, *, default: Any = None, type: Any = str, help: str = "",
            choices: Sequence[Any] | None = None, env: str | None = None) -> None:
        if flag in self._fixed:
            value, why = self._fixed[flag]
            self.parser.fix(flag, value, self.service, why)
            return
        self.parser.add(flag, default=default, type=type, help=help, choices=choices,
                        env=env or self.env_name(flag), owner=self.service)
        self.offered.append(flag)


class _Refused(argparse.Action):
    """A flag that a composed parser does not offer: giving it is an error that says why."""

    def __init__(self, option_strings, dest, why: str = "", **kwargs):
        kwargs.pop("nargs", None)
        super().__init__(option_strings, dest, nargs="?", **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string}: {self.why}")


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def config_from(cls: type[C], args: argparse.Namespace) -> C:
    """``cls`` (a config dataclass) from the parsed flags it has fields for; other flags are ignored."""
    values = vars(args)
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})


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
