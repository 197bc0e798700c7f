"""OpenAI's Batch API and the Files API under it (/v1/files, /v1/batches): a front end (services/gateway/README.md).

``lines.py`` (input lines, output and error files) and ``state.py`` (the batch's record and lifecycle) are
pure; ``store.py`` and ``files.py`` keep batches, line outcomes and files in NATS JetStream; ``runner.py``
runs a batch on the replica holding its lease; ``inprocess.py`` runs one line through the gateway's own
servicers; ``server.py`` is the gRPC glue Envoy transcodes to.
"""
