"""The gateway's extension flags (config.py adds them; edge.py reads the route one for the launcher)."""

from __future__ import annotations

from services.common.flags import Flags

ROUTE_FLAG = "--frontend-route-extension"


def add_route_flag(p: Flags) -> None:
    p.add(ROUTE_FLAG, repeatable=True, dynamo_env="DYN_FRONTEND_ROUTE_EXTENSIONS",
          help="an HTTP route extension: a name registered in the 'dynamo.frontend.routes' entry-point group, or a "
               "'module:function' path whose function returns services.gateway.extensions.Route objects; "
               "repeatable (the env twins take several, whitespace-separated). Launchers render Envoy's routes "
               "from the same flags (docs/architecture.md, \"Extension points\")")


def add_flags(p: Flags) -> None:
    add_route_flag(p)
    p.add("--chat-engine-factory", default="",
          help="a 'module:function' path: called with each chat model as it appears in discovery, it returns "
               "services.gateway.extensions.ChatHooks (a pre-hook on each /v1/chat/completions request, a "
               "post-hook on each chunk of its answer) or None; unset: no hooks (Dynamo has no flag for this)")
