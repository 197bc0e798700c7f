"""The OpenAI Responses API (``/v1/responses``) over the chat path.

request.py validates a body into a ``ResponsesRequest``; conversation.py turns its input items (and a
stored conversation) into chat messages and a ``ChatRequest``; render.py turns the pipeline's deltas
into output items, the response object and the streamed event grammar (``ResponsesRenderer``, the front
door's renderer, stores it when done); store.py keeps responses in
NATS JetStream KV so any gateway replica can continue them; server.py is the gRPC glue.
"""
