"""The gateway's core, shared by every front end: the request types, ``Delta``, the proto conversion,
the pipeline and the trace (services/gateway/README.md has the map)."""
