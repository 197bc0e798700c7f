"""JetStream buckets replicated over a NATS cluster, single copies on a lone server.

Every bucket the mesh creates (worker discovery, stored responses, video jobs, the media Object Store) goes
through ``create_replicated``: on a clustered JetStream (``meshfront run --nats-cluster 3``, deploy/k8s) it
gets three replicas, so one node's loss keeps its data and its writes (a quorum of two remains); a lone
server refuses replicas (JetStream error 10074) and gets one. Asking the server beats counting the URLs a
client was given: a client may name one node of a cluster and learn the others from it.

A replicated stream whose leader dies answers nothing until the others elect one, so every store's reads
and writes go through ``through_failover`` (writes through ``publish_through_failover``, which also keeps a
retried write from being stored twice): a request in those seconds waits, it does not get a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.errors import NoRespondersError
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, BucketNotFoundError, NoStreamResponseError, NotFoundError, ServiceUnavailableError

T = TypeVar("T")

CLUSTER_REPLICAS = 3
NOT_CLUSTERED = 10074  # JSStreamReplicasNotSupportedErr: "replicas > 1 not supported in non-clustered mode"
# A replicated stream whose leader died answers nothing until the two others elect one, 4-9 s later on an idle
# machine; on a loaded one (CI's three test tiers at once) a store write still got "no response from stream"
# 12 s after the kill. The wait matches the cards' TTL on a cluster (CLUSTER_TTL_S, 20 s).
FAILOVER_S = 20.0
# A write that timed out is one too: it reached the old leader as it died (nats-py's TimeoutError is this one).
_LEADERLESS = (NoStreamResponseError, NoRespondersError, ServiceUnavailableError, TimeoutError)
_RETRY_S = 0.25
# JetStream's "wrong last sequence" codes: a compare-and-set publish lost (or, on a retry, was already stored).
WRONG_LAST = (10071, 10164)


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
            return await _within(op, timeout_s)
        except _LEADERLESS:
            if loop.time() + _RETRY_S >= deadline:
                raise
            await asyncio.sleep(_RETRY_S)


async def _within(op: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """``op()`` or TimeoutError after ``timeout_s``. Not ``asyncio.wait_for``: a try cancelled by its timeout can
    end with the library's own error instead of CancelledError (nats-py's ``keys()`` raises NoKeysError from its
    cleanup), which wait_for would return in place of the timeout (an unanswered listing read as an empty
    bucket). Such a try is left to finish alone, its exception marked seen so asyncio does not log it."""
    attempt = asyncio.ensure_future(op())
    attempt.add_done_callback(_retrieved)
    try:
        done, _ = await asyncio.wait({attempt}, timeout=timeout_s)
    except asyncio.CancelledError:
        attempt.cancel()
        raise
    if not done:
        attempt.cancel()
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    return attempt.result()


def _retrieved(attempt: asyncio.Future) -> None:
    if not attempt.cancelled():
        attempt.exception()


async def publish_through_failover(js: JetStreamContext, stream: str, subject: str, payload: bytes, *,
                                   timeout_s: float, headers: dict[str, str] | None = None,
                                   msg_ttl: float | None = None, failover_s: float = FAILOVER_S) -> api.PubAck:
    """``js.publish`` to ``stream`` waited through a leader election (``through_failover``), stored once.

    A try that timed out may still have been stored by the leader as it died, so every try carries the same
    ``Nats-Msg-Id``: a plain publish tried again is dropped as a duplicate (JetStream acks the stored one). A
    compare-and-set (``Nats-Expected-Last-Subject-Sequence``) is checked before duplicates are, so its retry
    fails with "wrong last sequence"; when the subject's last message is this write's own, that is its ack,
    not a lost race.
    """
    msg_id = secrets.token_hex(12)
    tries = 0

    async def attempt() -> api.PubAck:
        nonlocal tries
        tries += 1
        try:
            # A copy each try: publish adds its TTL header to the dict it is given.
            return await js.publish(subject, payload, headers={**(headers or {}), api.Header.MSG_ID: msg_id},
                                    msg_ttl=msg_ttl)
        except APIError as e:
            if tries == 1 or e.err_code not in WRONG_LAST:
                raise
            last = await js.get_last_msg(stream, subject)
            if (last.headers or {}).get(api.Header.MSG_ID) != msg_id or last.seq is None:
                raise
            return api.PubAck(stream=stream, seq=last.seq)

    return await through_failover(attempt, timeout_s, failover_s)


def nats_servers(url: str) -> list[str]:
    """``--nats-url``: one URL, or every node of a cluster comma-separated (the client fails over between them)."""
    return [u.strip() for u in url.split(",") if u.strip()]


async def ensure_stream(js: JetStreamContext, name: str, config: Callable[[int], api.StreamConfig]) -> None:
    """Opens stream ``name``, creating it from ``config(replicas)`` (``create_replicated``) when absent.

    Replicas of a service start together, so another may create the stream between the lookup and the
    creation: its creation failing is then no error, and the final lookup is what says whether it exists."""
    try:
        await js.stream_info(name)
        return
    except NotFoundError:
        pass
    with contextlib.suppress(APIError):  # created meanwhile by another replica, or refused: the lookup tells
        await create_replicated(lambda replicas: js.add_stream(config(replicas)))
    await js.stream_info(name)


async def open_or_create(open_bucket: Callable[[], Awaitable[T]], create: Callable[[int], Awaitable[T]]) -> T:
    """The KV or Object Store bucket ``open_bucket()`` finds, else ``create(replicas)`` (``create_replicated``).

    Replicas of a service start together, so another may create the bucket between the lookup and the
    creation: a creation the server refuses (``APIError``) is then no error, and opening again says whether
    the bucket exists. Anything else (NATS down, a timeout) is the caller's to handle."""
    try:
        return await open_bucket()
    except BucketNotFoundError:
        pass
    try:
        return await create_replicated(create)
    except APIError:
        return await open_bucket()
