"""The mocker: a simulated engine (KV cache, batching scheduler, timing) behind the worker API."""
