"""Buckets get three replicas on a clustered JetStream and one on a lone server; discovery's TTL follows."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.errors import APIError, ServerError

from services.common.discovery import CLUSTER_TTL_S, DEFAULT_TTL_S, discovery_ttl_s
from services.common.jetstream_replicas import NOT_CLUSTERED, create_replicated, nats_servers

pytestmark = pytest.mark.unit


def _creator(refuse: APIError | None):
    asked: list[int] = []

    async def create(replicas: int) -> int:
        asked.append(replicas)
        if refuse is not None and replicas > 1:
            raise refuse
        return replicas

    return create, asked


def test_three_replicas_on_a_cluster_one_where_the_server_refuses_replicas():
    create, asked = _creator(None)
    assert asyncio.run(create_replicated(create)) == 3 and asked == [3]
    create, asked = _creator(ServerError(code=500, err_code=NOT_CLUSTERED,
                                         description="replicas > 1 not supported in non-clustered mode"))
    assert asyncio.run(create_replicated(create)) == 1 and asked == [3, 1]


def test_other_errors_are_not_taken_for_a_lone_server():
    create, asked = _creator(ServerError(code=503, err_code=10023, description="insufficient resources"))
    with pytest.raises(APIError):
        asyncio.run(create_replicated(create))
    assert asked == [3]  # a cluster short of nodes is not given a single copy behind the operator's back


def test_every_node_url_and_the_ttl_that_follows():
    assert nats_servers("nats://a:4222, nats://b:4222,nats://c:4222") == ["nats://a:4222", "nats://b:4222",
                                                                        "nats://c:4222"]
    assert discovery_ttl_s("nats://a:4222") == DEFAULT_TTL_S
    assert discovery_ttl_s("nats://a:4222,nats://b:4222,nats://c:4222") == CLUSTER_TTL_S


def test_a_leaderless_stream_is_waited_for_and_other_errors_are_not():
    from nats.js.errors import NoStreamResponseError

    from services.common.jetstream_replicas import through_failover

    tries: list[int] = []

    async def elected_on_third_try() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise NoStreamResponseError
        return "stored"

    assert asyncio.run(through_failover(elected_on_third_try, 1.0)) == "stored" and len(tries) == 3
    with pytest.raises(NoStreamResponseError):  # past the failover budget the error reaches the caller
        asyncio.run(through_failover(_never, 1.0, failover_s=0.6))

    async def refused() -> None:
        tries.append(1)
        raise ServerError(code=400, err_code=10071, description="wrong last sequence")

    tries.clear()
    with pytest.raises(APIError):
        asyncio.run(through_failover(refused, 1.0))
    assert len(tries) == 1


async def _never() -> None:
    from nats.js.errors import NoStreamResponseError

    raise NoStreamResponseError


def test_a_bucket_created_meanwhile_by_another_replica_is_opened_and_other_failures_reach_the_caller():
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.errors import BucketNotFoundError

    from services.common.jetstream_replicas import open_or_create

    existing: list[str] = []

    async def open_bucket() -> str:
        if not existing:
            raise BucketNotFoundError
        return existing[0]

    async def lost_the_race(replicas: int) -> str:
        existing.append("theirs")  # another replica's creation landed first, with its own config
        raise ServerError(code=400, err_code=10058, description="stream name already in use")

    assert asyncio.run(open_or_create(open_bucket, lost_the_race)) == "theirs"

    existing.clear()

    async def created(replicas: int) -> str:
        return f"ours, {replicas} replicas"

    assert asyncio.run(open_or_create(open_bucket, created)) == "ours, 3 replicas"

    async def nats_away(replicas: int) -> str:
        raise NatsTimeoutError

    with pytest.raises(NatsTimeoutError):  # once swallowed, then reported as "bucket not found"
        asyncio.run(open_or_create(open_bucket, nats_away))


def test_a_try_that_answers_its_cancel_with_an_error_is_not_left_unretrieved():
    """nats-py's keys() raises NoKeysError from its cleanup when cancelled: a timed-out try is a TimeoutError (not
    that error: an empty bucket to its caller), and neither it nor a try whose caller was cancelled leaves the
    exception for asyncio to log as "never retrieved" (a traceback in a service's log at shutdown)."""
    from services.common.jetstream_replicas import through_failover

    unretrieved: list[dict] = []

    async def keys() -> list[str]:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise LookupError("no keys found") from None
        return []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unretrieved.append(context))
        with pytest.raises(TimeoutError):
            await through_failover(keys, timeout_s=0.05, failover_s=0)
        caller = asyncio.create_task(through_failover(keys, timeout_s=5))
        await asyncio.sleep(0.05)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(0)

    asyncio.run(main())
    import gc

    gc.collect()  # an unretrieved exception is reported when its task is collected
    assert not unretrieved, unretrieved
