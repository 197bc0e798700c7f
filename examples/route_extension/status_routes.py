"""Two HTTP routes served by the gateway, through Envoy:

- ``GET /example/status``: the gateway's readiness and models (a plain function: it runs in a worker thread);
- ``POST /example/echo``: ``{"text": "..."}`` back with its length (a coroutine function: awaited on the
  gateway's loop); anything else is a 400 in OpenAI's error shape.

Serve them with ``--frontend-route-extension examples.route_extension.status_routes:routes`` (or
``DYN_FRONTEND_ROUTE_EXTENSIONS``): ``meshfront run --gateway-flag=--frontend-route-extension=...``.
"""

from __future__ import annotations

from services.gateway.extensions import ExtensionError, Response, Route, RouteRequest


def status(request: RouteRequest) -> Response | dict:
    body = {"ready": request.state.is_ready(), "models": request.state.model_names(),
            "request_id": request.request_id}
    # A status other than 200 (here: not ready yet) is a Response; a plain value is a 200.
    return body if body["ready"] else Response(503, body)


async def echo(request: RouteRequest) -> dict:
    text = request.json.get("text") if isinstance(request.json, dict) else None
    if not isinstance(text, str):
        raise ExtensionError(400, "'text' must be a string", param="text")
    return {"text": text, "length": len(text)}


def routes() -> list[Route]:
    """The provider the flag names: called once at the gateway's start (and by the launcher, for Envoy)."""
    return [Route("GET", "/example/status", status), Route("POST", "/example/echo", echo)]
