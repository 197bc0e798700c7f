"""Extension points: Python code that the gateway's flags name, loaded at start.

- HTTP routes (``--frontend-route-extension``, Dynamo's flag): a provider returns ``Route`` objects whose
  handlers answer GET or POST on static paths, through Envoy like every built-in route (routes.py, server.py;
  Envoy's side: edge.py).
- The chat engine factory (``--chat-engine-factory``): called as each chat model appears, it returns
  ``ChatHooks`` for that model, a pre-hook on each chat request and a post-hook on each chunk of its answer
  (engine_factory.py; applied by the openai front end: core/extension_hooks.py).

What extension code imports is re-exported here; examples/route_extension/ and examples/engine_factory/ use it.
"""

from services.gateway.core.extension_hooks import ChatHooks, ExtensionError
from services.gateway.extensions.engine_factory import ModelInfo
from services.gateway.extensions.routes import FrontendState, Response, Route, RouteRequest

__all__ = ["ChatHooks", "ExtensionError", "FrontendState", "ModelInfo", "Response", "Route", "RouteRequest"]
