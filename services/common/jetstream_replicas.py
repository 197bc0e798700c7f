"""JetStream buckets replicated over a NATS cluster, single copies on a lone server.

Every bucket the mesh creates (worker discovery, stored responses, video jobs, the media Object Store) goes
through ``create_replicated``: on a clustered JetStream (``meshfront run --nats-cluster 3``, deploy/k8s) it
gets three replicas, so one node's loss keeps its data and its writes (a quorum of two remains); a lone
server refuses replicas (JetStream error 10074) and gets one. Asking the server beats counting the URLs a
client was given: a client may name one node of a cluster and learn the others from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.errors import NoRespondersError
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

T = TypeVar("T")

CLUSTER_REPLICAS = 3
NOT_CLUSTERED = 10074  # JSStreamReplicasNotSupportedErr: "replicas > 1 not supported in non-clustered mode"
# A replicated stream whose leader died answers nothing until the two others elect one, 4-9 s later.
FAILOVER_S = 12.0
# A write that timed out is one too: it reached the old leader as it died (nats-py's TimeoutError is this one).
_LEADERLESS = (NoStreamResponseError, NoRespondersError, ServiceUnavailableError, TimeoutError)
_RETRY_S = 0.25


async def create_replicated(create: Callable[[int], Awaitable[T]]) -> T:
    """``create(replicas)`` with three replicas, or with one where the server is not clustered."""
    try:
        return await create(CLUSTER_REPLICAS)
    except APIError as e:
        if e.err_code != NOT_CLUSTERED:
            raise
    return await create(1)


async def through_failover(op: Callable[[], Awaitable[T]], timeout_s: float, failover_s: float = FAILOVER_S) -> T:
    """``op()`` (a bucket read or write) within ``timeout_s`` a try, tried again while its stream has no leader
    for up to ``failover_s``: a request that arrives while a node dies waits for the election, not a 503."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + failover_s
    while True:
        try:
            return await asyncio.wait_for(op(), timeout_s)
        except _LEADERLESS:
            if loop.time() + _RETRY_S >= deadline:
                raise
            await asyncio.sleep(_RETRY_S)


def nats_servers(url: str) -> list[str]:
    """``--nats-url``: one URL, or every node of a cluster comma-separated (the client fails over between them)."""
    return [u.strip() for u in url.split(",") if u.strip()]
