"""The shapes of a disaggregated request's two legs (services/postprocessor/disagg_legs.py); the legs running on
real mockers are tests/service/postprocessor/test_disagg_legs.py and tests/mesh/test_disagg.py."""

from __future__ import annotations

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.postprocessor.disagg_legs import decode_leg, prefill_leg
from services.postprocessor.disagg_paired import announces_pairing, paired_decode_leg
from services.postprocessor.migration import WorkerRoute

pytestmark = pytest.mark.unit

ROUTE = WorkerRoute("decode-1", "127.0.0.1:2", "prefill-1", "127.0.0.1:1")


def request(**stop) -> common_pb2.PreprocessedRequest:
    req = common_pb2.PreprocessedRequest(request_id="r", model="m", token_ids=[1, 2, 3])
    req.stop.MergeFrom(common_pb2.StopConditions(**stop))
    return req


def test_the_prefill_leg_asks_one_token_and_names_its_decode_worker():
    original = request(max_tokens=50, min_tokens=5)
    leg = prefill_leg(original, ROUTE).request
    assert (leg.stop.max_tokens, leg.stop.min_tokens) == (1, 1)
    assert leg.disaggregation.role == common_pb2.DISAGGREGATION_ROLE_PREFILL
    assert (leg.disaggregation.peer_worker_id, leg.disaggregation.peer_address) == ("decode-1", "127.0.0.1:2")
    assert not leg.disaggregation.kv_transfer_params  # the worker asks for its own remote decode
    assert list(leg.token_ids) == [1, 2, 3] and original.stop.max_tokens == 50  # a copy
    assert prefill_leg(request(), ROUTE).request.stop.max_tokens == 1  # no budget given: still one token
    assert not prefill_leg(request(max_tokens=9), ROUTE).request.stop.HasField("min_tokens")


def test_the_decode_leg_continues_after_the_first_token_with_the_params_untouched():
    leg = decode_leg(request(max_tokens=50, min_tokens=5), [77], ROUTE, b'{"remote_handle": "h"}').request
    assert list(leg.token_ids) == [1, 2, 3, 77]
    assert (leg.stop.max_tokens, leg.stop.min_tokens) == (49, 4)
    assert leg.disaggregation.role == common_pb2.DISAGGREGATION_ROLE_DECODE
    assert leg.disaggregation.kv_transfer_params == b'{"remote_handle": "h"}'
    assert (leg.disaggregation.peer_worker_id, leg.disaggregation.peer_address) == ("prefill-1", "127.0.0.1:1")


def test_the_paired_decode_leg_takes_the_prefill_legs_prompt_and_the_requests_budgets():
    leg = paired_decode_leg(request(max_tokens=50, min_tokens=5), ROUTE, b'{"bootstrap_room": 7}').request
    assert list(leg.token_ids) == [1, 2, 3] and (leg.stop.max_tokens, leg.stop.min_tokens) == (50, 5)
    assert leg.disaggregation.role == common_pb2.DISAGGREGATION_ROLE_DECODE
    assert leg.disaggregation.kv_transfer_params == b'{"bootstrap_room": 7}'
    assert (leg.disaggregation.peer_worker_id, leg.disaggregation.peer_address) == ("prefill-1", "127.0.0.1:1")


def test_only_transfer_parameters_before_any_token_announce_the_paired_order():
    params = b'{"bootstrap_room": 7}'
    assert announces_pairing(worker_pb2.GenerateResponse(kv_transfer_params=params))
    # A sequential prefill leg's last chunk (the mocker's, vLLM's) carries its token and a finish with them.
    assert not announces_pairing(worker_pb2.GenerateResponse(
        token_ids=[5], finish_reason=common_pb2.FINISH_REASON_LENGTH, kv_transfer_params=params))
    assert not announces_pairing(worker_pb2.GenerateResponse(finish_reason=common_pb2.FINISH_REASON_LENGTH,
                                                             kv_transfer_params=params))
    assert not announces_pairing(worker_pb2.GenerateResponse(token_ids=[5]))
