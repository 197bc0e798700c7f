"""The edge's own documents, served through Envoy (EdgeService): /metrics, /openapi.json, /docs."""
