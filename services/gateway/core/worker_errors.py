"""What a worker the gateway calls itself (embedding and media workers: no postprocessor between) failed with.

The worker's own reasons (invalid request, overloaded) stay what they are; anything else (dead, frozen,
unreachable, not that kind of worker after all) is ``WorkerFailed``, which the caller retries on another
worker before its first byte and otherwise answers 503. The transport's details name hosts, so they go to
the log, not the client.
"""

from __future__ import annotations

import logging

import grpc

from services.common.errors import Cancelled, Internal, MeshError, WorkerFailed, from_rpc_error

log = logging.getLogger(__name__)


def worker_error(e: grpc.aio.AioRpcError, address: str, kind: str) -> MeshError:
    """``kind`` names the worker in the log and the message: "embedding", "media"."""
    err = from_rpc_error(e)
    if isinstance(err, (WorkerFailed, Cancelled, Internal)):
        log.warning("%s worker %s failed: %s %s", kind, address, e.code().name, e.details())
        return WorkerFailed(f"the {kind} worker serving this request failed")  # its code is in the log
    return err
