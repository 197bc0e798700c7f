"""The flush rule (services/postprocessor/aggregated.py, ``FlushRule``): when gathered worker messages leave as one
response. The streams it shapes end to end: tests/service/postprocessor/test_postprocessor_server.py and
tests/mesh/test_stream_interval.py."""

from __future__ import annotations

import dataclasses

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import WorkerFailed
from services.common.pump import Batch
from services.postprocessor.aggregated import FlushRule

pytestmark = pytest.mark.unit


@dataclasses.dataclass
class Builder:
    """The one thing the rule asks of the request's builder."""

    first: bool = False


def tokens(n: int, finish: int = 0) -> worker_pb2.GenerateResponse:
    return worker_pb2.GenerateResponse(token_ids=list(range(n)), finish_reason=finish)


def test_an_interval_of_one_lets_every_read_out_as_it_came():
    rule = FlushRule(1, Builder())
    batch = Batch([tokens(1), tokens(2)])
    assert rule.take(batch) is batch.messages
    assert rule.take(Batch([])) == []


def test_above_one_messages_wait_until_they_carry_the_interval():
    rule = FlushRule(4, Builder())
    first, second, third = tokens(1), tokens(2), tokens(1)
    assert rule.take(Batch([first])) == []
    assert rule.take(Batch([second])) == []
    assert rule.take(Batch([third])) == [first, second, third]
    assert rule.take(Batch([tokens(3)])) == []  # the count starts again


@pytest.mark.parametrize("batch", [
    Batch([tokens(1, common_pb2.FINISH_REASON_EOS)]),
    Batch([tokens(1)], ended=True),
    Batch([tokens(1)], error=WorkerFailed("worker failed")),
], ids=["finish", "ended", "failed"])
def test_a_finish_and_the_streams_end_or_failure_never_wait(batch):
    rule = FlushRule(8, Builder())
    held = tokens(1)
    assert rule.take(Batch([held])) == []
    assert rule.take(batch) == [held, *batch.messages]


def test_the_first_response_never_waits():
    builder = Builder(first=True)
    rule = FlushRule(8, builder)
    first = tokens(1)
    assert rule.take(Batch([first])) == [first]
    builder.first = False
    assert rule.take(Batch([tokens(1)])) == []
