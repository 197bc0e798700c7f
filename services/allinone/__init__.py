"""The all-in-one shape: the gateway with the preprocessor, router and postprocessor in its process.

It is the same mesh, not a thinner one: each stage is built by its own ``build(config, ...)``
(services/<stage>/assembly.py), the very function its own process uses, from the stage's own flags
(config.py composes them), and the gateway reaches the stages through in-process clients
(clients.py) instead of gRPC ones. This package sits above the services: it may import them; no
service package imports another one.
"""
