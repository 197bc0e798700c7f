"""What Envoy needs of the gateways' route extensions: each path and its methods (``edge_routes``).

The edge's route table is rendered at launch (services/launcher/envoy_config.py ``extension_route``), so a
launcher reads the gateway's own ``--frontend-route-extension`` flags (and their env twins) from the gateway's
arguments, loads the same extensions the gateways will, and renders a route for each path. A bad extension
fails the launch as it would fail the gateway: one line (``ExtensionSpecError``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser
from services.gateway.extensions.flags import add_route_flag
from services.gateway.extensions.loading import load_routes


def route_names(gateway_args: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The route extensions ``gateway_args`` (a gateway's or an all-in-one's command line) and ``env`` name."""
    p = FlagParser("gateway", "route extensions", env, allow_abbrev=False)
    add_route_flag(p)
    args, _ = p.parse_known(list(gateway_args))
    return tuple(args.frontend_route_extension)


def edge_routes(gateway_args: Sequence[str], env: Mapping[str, str] | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """(path, methods) of every extension route, in declaration order."""
    by_path: dict[str, list[str]] = {}
    for route in load_routes(route_names(gateway_args, env)):
        by_path.setdefault(route.path, []).append(route.method)
    return [(path, tuple(methods)) for path, methods in by_path.items()]
