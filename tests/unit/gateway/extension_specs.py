"""Route extension providers that are wrong in one way each (tests/unit/gateway/test_extension_points.py)."""

from __future__ import annotations

from services.gateway.extensions import Route


def _ok(request):
    return {}


def good():
    return Route("get", "/ext/one", _ok)


def none():
    return None


def clashes_with_models():
    return [Route("GET", "/v1/models", _ok)]


def clashes_with_a_template():
    return [Route("POST", "/v1/models/org/name", _ok)]


def under_grpc_prefix():
    return [Route("GET", "/meshfront.gateway.v1.GatewayService/ChatCompletions", _ok)]


def duplicate():
    return [Route("GET", "/ext/one", _ok), Route("GET", "/ext/one", _ok)]


def path_parameter():
    return [Route("GET", "/ext/{id}", _ok)]


def colon_segment():
    return [Route("GET", "/ext/:id", _ok)]


def put_method():
    return [Route("PUT", "/ext/one", _ok)]


def not_routes():
    return ["GET /ext/one"]


def raises():
    raise RuntimeError("the provider's database is down")


NOT_CALLABLE = 3
