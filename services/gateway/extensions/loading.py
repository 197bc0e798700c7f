"""Finds the extension code the gateway's flags name, and checks what it declares before anything serves.

A route extension (``--frontend-route-extension``, repeatable; env ``DYN_FRONTEND_ROUTE_EXTENSIONS``,
whitespace-separated) is, as in Dynamo 1.6.1, a name registered in the ``dynamo.frontend.routes`` entry-point
group (preferred) or a ``module:function`` path (``function`` may be dotted: ``module:Class.method``). Its
provider is called with no arguments and returns a ``Route``, an iterable of them, or None. Repeated names load
once, in first-seen order. The chat engine factory (``--chat-engine-factory``, Meshfront's flag: Dynamo builds
its factory from ``--chat-processor``) is a ``module:function`` path.

Every failure is an ``ExtensionSpecError`` (a ValueError) of one line: the gateway's config check turns it into
exit status 2, and the launcher, which renders Envoy's routes from the same routes (edge.py), fails the same way.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
from collections.abc import Iterable, Sequence
from typing import Any

from services.gateway.extensions.routes import Route

ROUTE_GROUP = "dynamo.frontend.routes"
# Prefixes of the native gRPC services Envoy routes to the gateway: an HTTP route there would shadow them.
RESERVED_PREFIXES = ("/meshfront.", "/inference.", "/grpc.")


class ExtensionSpecError(ValueError):
    """A flag names extension code that cannot be loaded, or that declares what cannot be served."""


def _import(spec: str, what: str) -> Any:
    """``module:attr.path`` resolved; the error names the spec and what is missing."""
    module_path, _, attr = spec.partition(":")
    if not module_path or not attr:
        raise ExtensionSpecError(f"{what} {spec!r} is not a 'module:function' path")
    try:
        obj: Any = importlib.import_module(module_path)
    except ImportError as e:
        raise ExtensionSpecError(f"{what} {spec!r}: cannot import module {module_path!r} ({e})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ExtensionSpecError(f"{what} {spec!r}: module {module_path!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ExtensionSpecError(f"{what} {spec!r} is not callable")
    return obj


def _route_provider(name: str) -> Any:
    """A registered entry-point name wins; otherwise a ``module:function`` path (only one with a ``:``: a
    mistyped name is an error listing the registered ones, never an import attempt)."""
    points = list(importlib.metadata.entry_points().select(group=ROUTE_GROUP))
    matches = [p for p in points if p.name == name]
    if len(matches) > 1:
        raise ExtensionSpecError(f"route extension {name!r} is registered more than once in {ROUTE_GROUP!r}")
    if matches:
        try:
            provider = matches[0].load()
        except Exception as e:  # noqa: BLE001 - any failure of a package's code is a bad extension
            raise ExtensionSpecError(f"route extension {name!r} ({matches[0].value}) failed to load: {e}") from None
        if not callable(provider):
            raise ExtensionSpecError(f"route extension {name!r} ({matches[0].value}) is not callable")
        return provider
    if ":" in name:
        return _import(name, "route extension")
    known = ", ".join(sorted(p.name for p in points)) or "<none>"
    raise ExtensionSpecError(f"unknown route extension {name!r}: not registered in {ROUTE_GROUP!r} (registered: "
                             f"{known}) and not a 'module:function' path")


def _routes_of(name: str, provided: Any) -> list[Route]:
    if provided is None:
        return []
    items: Iterable[Any] = [provided] if isinstance(provided, Route) else provided
    try:
        routes = list(items)
    except TypeError:
        raise ExtensionSpecError(f"route extension {name!r} returned {type(provided).__name__}; it must return a "
                                 "Route, an iterable of Routes, or None") from None
    for route in routes:
        if not isinstance(route, Route):
            raise ExtensionSpecError(f"route extension {name!r} returned {route!r}; expected "
                                     "services.gateway.extensions.Route")
    return routes


@functools.cache
def load_routes(names: tuple[str, ...]) -> tuple[Route, ...]:
    """Every route the named extensions declare, checked (see ``check_routes``); loaded once per process."""
    routes: list[Route] = []
    for name in dict.fromkeys(names):
        provider = _route_provider(name)
        try:
            provided = provider()
        except Exception as e:  # noqa: BLE001 - the provider's own failure, named on one line
            raise ExtensionSpecError(f"route extension {name!r} failed: {type(e).__name__}: {e}") from None
        routes.extend(_routes_of(name, provided))
    check_routes(routes)
    return tuple(routes)


def _builtin_patterns() -> list[tuple[str, re.Pattern[str]]]:
    from services.gateway.http_api.routes import ENDPOINTS  # the one list of built-in routes

    # A path parameter may hold '/' (a model id does): a path that any value would make is taken.
    return [(e.path, re.compile(re.sub(r"\\\{[^}]*\\\}", ".+", re.escape(e.path)))) for e in ENDPOINTS]


def check_routes(routes: Sequence[Route]) -> None:
    """No two routes with one method and path, and none on a built-in route's path (with any method: the
    edge matches a path before a method) or under a native gRPC service's prefix."""
    seen: set[tuple[str, str]] = set()
    builtins = _builtin_patterns()
    for route in routes:
        key = (route.method, route.path)
        if key in seen:
            raise ExtensionSpecError(f"duplicate extension route: {route.method} {route.path}")
        seen.add(key)
        clash = next((template for template, pattern in builtins if pattern.fullmatch(route.path)), None)
        if clash is not None:
            raise ExtensionSpecError(f"extension route {route.method} {route.path} clashes with the built-in route "
                                     f"{clash}")
        if route.path.startswith(RESERVED_PREFIXES):
            raise ExtensionSpecError(f"extension route {route.method} {route.path} is under a gRPC service's prefix "
                                     f"({', '.join(RESERVED_PREFIXES)})")


@functools.cache
def load_factory(spec: str) -> Any:
    """The chat engine factory ``spec`` names (called later, once per model: engine_factory.py)."""
    return _import(spec, "chat engine factory")
