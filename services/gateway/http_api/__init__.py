"""The HTTP API's one description: every route with its request and response schemas (routes.py).

/openapi.json and /docs are generated from it (openapi.py); tests/unit/gateway/test_openapi.py checks
it against the routes Envoy's transcoder serves (deploy/envoy/gateway.pb) and the request parsers.
"""
