"""POST /v1/chat/completions and /v1/completions (and the model list, health and liveness):
request.py parses, render.py writes chunks and bodies, server.py is the gRPC glue."""
