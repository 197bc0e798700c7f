"""Command-line flags with environment-variable twins.

Every flag ``--foo-bar`` of service ``router`` can also be set with
``MESHFRONT_ROUTER_FOO_BAR`` (Kubernetes passes config as env); the flag wins
over the env var, which wins over the default. ``--help`` shows the twin. An env twin's value goes
through the same checks as the flag's (its type, its ``choices``): Kubernetes configures every
service through env, so a bad value there must fail the start as it does on the command line. Every
such failure is one line on stderr and exit status 2 (``OneLineParser``).

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

from services.common import namespace, static_model

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
              "off": False}


class FlagCollision(ValueError):
    """Two services of one composed parser define the same flag, and nobody said which one wins."""


class Flags(Protocol):
    """What a service's ``add_flags`` needs: a ``FlagParser`` or one stage of a composed one."""

    def add(self, flag: str, *, default: Any = None, type: Any = str, help: str = "",
            choices: Sequence[Any] | None = None, env: str | None = None, aliases: Sequence[str] = (),
            dynamo_env: str = "", repeatable: bool = False) -> None: ...


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (``meshfront router: argument --x: ...``) and exit status 2:
    the same shape as a bad value that a config's ``validate`` finds (services/common/service_main.py)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (--help lists the flags)\n")


class _InvalidEnv:
    """The default of a flag whose env twin holds a bad value: an error unless the flag is given."""

    def __init__(self, message: str):
        self.message = message

    def __repr__(self) -> str:
        return "<invalid env value>"


class FlagParser:
    """An argparse wrapper that gives every flag an env twin."""

    def __init__(self, service: str, description: str, env: Mapping[str, str] | None = None, *,
                 allow_abbrev: bool = True, default_overrides: Mapping[str, Any] | None = None):
        self.service = service
        self._env = os.environ if env is None else env
        # flag -> the default this composition gives it instead of the service's own (``meshfront frontend``
        # takes Dynamo's defaults: services/frontend/config.py)
        self._default_overrides = dict(default_overrides or {})
        # dest -> where its value came from when not the default: "env NAME" (filled by ``add``) or "flag"
        # (filled by ``parse``); ``--check-config`` prints it
        self.sources: dict[str, str] = {}
        self.env_twins: dict[str, tuple[str, ...]] = {}  # dest -> its env twins, the Meshfront one first
        # allow_abbrev=False where unknown flags pass through to an engine: argparse would otherwise
        # take vLLM's --model for an abbreviation of our --model-dir.
        self._parser = OneLineParser(prog=f"meshfront {service}", description=description,
                                     allow_abbrev=allow_abbrev)
        self.owners: dict[str, str] = {}  # flag -> the service that defined it
        self._groups: dict[str, Any] = {}

    def env_name(self, flag: str) -> str:
        return f"MESHFRONT_{self.service.upper()}_{flag.lstrip('-').replace('-', '_').upper()}"

    def add(self, flag: str, *, default: Any = None, type: Any = str, help: str = "",
            choices: Sequence[Any] | None = None, env: str | None = None, owner: str = "",
            aliases: Sequence[str] = (), dynamo_env: str = "", repeatable: bool = False) -> None:
        """Adds ``flag``; ``env`` overrides the twin's name for flags shared by all services.

        ``aliases`` are other spellings of the flag (Dynamo's deprecated ones: ``--kv-events`` for
        ``--router-kv-events``; a boolean's ``--no-`` forms come with each). ``dynamo_env`` is the flag's
        Dynamo env twin (``DYN_ROUTER_MODE``), read when the Meshfront twin is not set. ``repeatable``: the
        value is a tuple, one item per use of the flag (Dynamo's ``action="append"``); an env twin holds the
        items whitespace-separated, and giving the flag at all replaces them (the flag wins, as elsewhere)."""
        owner = owner or self.service
        for name in (flag, *aliases):
            if name in self.owners:
                raise FlagCollision(f"{name} of {owner} collides with {name} of {self.owners[name]}: resolve it "
                                    "explicitly where the services are composed")
            self.owners[name] = owner
        default = self._default_overrides.get(flag, default)
        env_name = env or self.env_name(flag)
        twins = [env_name, *([dynamo_env] if dynamo_env else [])]
        self.env_twins[_dest(flag)] = tuple(twins)
        for twin in twins:
            if twin in self._env:
                default = (self._from_env(flag, twin, self._env[twin], type, choices) if not repeatable
                           else self._items_from_env(flag, twin, self._env[twin], type, choices))
                self.sources[_dest(flag)] = f"env {twin}"
                break
        kwargs: dict[str, Any] = {"default": default, "dest": _dest(flag),
                                  "help": f"{help} [env {' or '.join(twins)}; default {default!r}]"}
        if type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif repeatable:
            kwargs.update(action=_Repeated, type=type, default=tuple(default or ()) if not isinstance(
                default, _InvalidEnv) else default, metavar=flag.lstrip("-").split("-")[-1].upper())
            if choices is not None:
                kwargs["choices"] = choices
        else:
            kwargs["type"] = type
            if choices is not None:
                kwargs["choices"] = choices
        self._target(owner).add_argument(flag, *aliases, **kwargs)

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
    def _from_env(flag: str, env_name: str, raw: str, type_: Any, choices: Sequence[Any] | None) -> Any:
        """The env twin's value, checked as argparse checks the flag's; an ``_InvalidEnv`` if it fails."""
        where = f"{env_name}={raw!r} (the env twin of {flag})"
        if type_ is bool:
            value = BOOL_WORDS.get(raw.strip().lower())
            if value is None:
                return _InvalidEnv(f"{where}: not a boolean; use one of {', '.join(BOOL_WORDS)}")
            return value
        try:
            value = type_(raw)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            return _InvalidEnv(f"{where}: invalid {getattr(type_, '__name__', 'value')} value")
        if choices is not None and value not in choices:
            return _InvalidEnv(f"{where}: invalid choice (choose from {', '.join(map(repr, choices))})")
        return value

    @classmethod
    def _items_from_env(cls, flag: str, env_name: str, raw: str, type_: Any,
                        choices: Sequence[Any] | None) -> tuple[Any, ...] | _InvalidEnv:
        """A repeatable flag's env twin: whitespace-separated items, each checked as one use of the flag."""
        items = [cls._from_env(flag, env_name, item, type_, choices) for item in raw.split()]
        return next((i for i in items if isinstance(i, _InvalidEnv)), tuple(items))

    def _check_env(self, args: argparse.Namespace) -> argparse.Namespace:
        """An env twin's bad value is an error unless its flag was given (the flag wins)."""
        for value in vars(args).values():
            if isinstance(value, _InvalidEnv):
                self._parser.error(value.message)
        return args

    def actions(self) -> list[argparse.Action]:
        """Every flag's argparse action, in the order added: its dest and spellings (a generated flag table)."""
        return list(self._parser._actions)

    def add_version(self, text: str) -> None:
        """``--version``: prints ``text`` and exits 0."""
        self._parser.add_argument("--version", action="version", version=text)

    def parse(self, argv: Sequence[str] | None) -> argparse.Namespace:
        args = self._check_env(self._parser.parse_args(argv))
        self._note_given(argv)
        return args

    def _note_given(self, argv: Sequence[str] | None) -> None:
        """Marks the flags on the command line as "flag" in ``sources`` (argparse does not say which values it
        parsed and which are defaults). Runs after a successful parse, so every option string is a real one."""
        known = self._parser._option_string_actions
        for token in argv if argv is not None else []:
            action = known.get(token.split("=", 1)[0]) if token.startswith("-") else None
            if action is not None and action.dest not in ("help", argparse.SUPPRESS):
                self.sources[action.dest] = "flag"

    def parse_known(self, argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
        """Parses this parser's flags and returns the others untouched (an engine's, passed through)."""
        args, rest = self._parser.parse_known_args(argv)
        return self._check_env(args), rest


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
            choices: Sequence[Any] | None = None, env: str | None = None, aliases: Sequence[str] = (),
            dynamo_env: str = "", repeatable: bool = False) -> None:
        if flag in self._fixed:
            value, why = self._fixed[flag]
            self.parser.fix(flag, value, self.service, why)
            return
        self.parser.add(flag, default=default, type=type, help=help, choices=choices,
                        env=env or self.env_name(flag), owner=self.service, aliases=aliases, dynamo_env=dynamo_env,
                        repeatable=repeatable)
        self.offered.append(flag)


class _Repeated(argparse.Action):
    """A repeatable flag's values as a tuple. The first use replaces the default (an env twin's items), where
    argparse's ``append`` would add to it: the flag wins over its env twin, as every other flag's does."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest)
        setattr(namespace, self.dest, (*(() if current is self.default else current), values))


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


def add_common_flags(p: FlagParser, *, port: int, watches_workers: bool = True) -> None:
    """Flags every service has: where it listens, how it drains, where NATS is, how it logs, which namespace
    it lives in (services/common/namespace.py). ``watches_workers``: a stage, which reads the workers' cards,
    also takes Dynamo's discovery prefix and the static model (a worker registers in one namespace and watches
    nobody)."""
    p.add("--host", default="127.0.0.1", help="address to listen on")
    p.add("--port", default=port, type=int, help="gRPC port (0 picks a free one)")
    p.add("--nats-url", default="nats://127.0.0.1:4222", env="MESHFRONT_NATS_URL", dynamo_env="NATS_SERVER",
          help="NATS server URL, or every node of a cluster comma-separated (NATS_SERVER is Dynamo's name)")
    p.add("--namespace", default=namespace.DEFAULT, type=namespace.namespace_name, env="MESHFRONT_NAMESPACE",
          dynamo_env="DYN_NAMESPACE",
          help="the mesh's namespace in NATS: workers register in it, a stage keeps its stores and subjects in it "
               "and sees only its workers (exact match; empty or 'dynamo': every namespace's workers, stores in "
               "'dynamo'); letters, digits, '_' and '-', at most 64")
    if watches_workers:
        p.add("--namespace-prefix", default="", type=namespace.namespace_prefix, env="MESHFRONT_NAMESPACE_PREFIX",
              dynamo_env="DYN_NAMESPACE_PREFIX",
              help="see the workers of every namespace starting with this (wins over --namespace for discovery; "
                   "the stage's own stores stay in --namespace)")
        # Dynamo's --model-name/--model-path/--kv-cache-block-size, as meshfront frontend passes them on.
        p.add("--static-model", default="", type=static_model.flag_value,
              help="serve NAME's tokenizer, chat template and config from DIR instead of what its workers' cards "
                   "published (services/common/static_model.py)")
        p.add("--static-model-block-size", default=0, type=static_model.block_size,
              help="with --static-model: NAME's KV block size for routing (0: its workers' cards')")
    p.add("--log-level", default="INFO", env="MESHFRONT_LOG_LEVEL", help="logging level")
    p.add("--dyn-debug-perf", default=False, type=bool, env="MESHFRONT_DEBUG_PERF", dynamo_env="DYN_DEBUG_PERF",
          help="log one line per request with this stage's wall and CPU time for it, by section "
               "(services/common/debug_perf.py; Dynamo's flag)")
    p.add("--metrics-port", default=0, type=int, help="Prometheus metrics port (0 = off)")
    p.add("--drain-grace-s", default=10.0, type=float,
          help="on SIGTERM: seconds calls in flight get to finish before they are cancelled")
    # Shared env names: every pod mounts its certificate at the same path (services/common/tls.py).
    p.add("--tls-cert", default="", env="MESHFRONT_TLS_CERT",
          help="PEM certificate (serverAuth+clientAuth): serve gRPC over TLS and present it to other services")
    p.add("--tls-key", default="", env="MESHFRONT_TLS_KEY", help="PEM private key of --tls-cert")
    p.add("--tls-ca", default="", env="MESHFRONT_TLS_CA",
          help="PEM CA: require client certificates it signed and trust only it for outgoing calls (mTLS)")
    add_nats_tls_flags(p)


def add_nats_tls_flags(p: Flags) -> None:
    """TLS on the process's NATS connections (services/common/nats_tls.py): Dynamo's flags, whose env twins are
    Dynamo's names, not ``DYN_``-prefixed (one pod env configures a Dynamo frontend and every Meshfront process)."""
    p.add("--nats-tls-ca-cert-path", default="", env="NATS_TLS_CA_CERT_PATH",
          help="PEM CA the NATS server's certificate is verified against (turns TLS to NATS on)")
    p.add("--nats-tls-insecure", default=False, type=bool, env="NATS_TLS_INSECURE",
          help="TLS to NATS without verifying the server's certificate (local development only)")
    p.add("--nats-tls-client-cert-path", default="", env="NATS_TLS_CLIENT_CERT_PATH",
          help="PEM client certificate presented to the NATS server (mTLS; with --nats-tls-client-key-path)")
    p.add("--nats-tls-client-key-path", default="", env="NATS_TLS_CLIENT_KEY_PATH",
          help="PEM private key of --nats-tls-client-cert-path")


def common_errors(port: int, drain_grace_s: float) -> list[str]:
    """What is wrong with the common flags' values (each config's ``validate`` adds its own)."""
    errors = []
    if not 0 <= port <= 65535:
        errors.append(f"--port {port} is not a port number (0..65535)")
    if drain_grace_s < 0:
        errors.append(f"--drain-grace-s {drain_grace_s} must be >= 0")
    return errors
