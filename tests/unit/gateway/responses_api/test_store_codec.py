"""The store's record encoding and key rule (the NATS round trip is tests/service/gateway/test_response_store.py)."""

import pytest

from services.gateway.responses_api.store import decode, encode, valid_key

pytestmark = pytest.mark.unit


def test_records_round_trip_compressed():
    record = {"response": {"id": "resp_1", "output": []}, "input": [{"type": "message", "text": "ü" * 10000}]}
    raw = encode(record)
    assert decode(raw) == record
    assert len(raw) < 1000  # repetitive conversation text compresses: long chains stay under NATS's payload limit


@pytest.mark.parametrize("key,ok", [("resp_0123abcd", True), ("a-b_c=d/e.f", True), ("", False),
                                    ("has space", False), ("wild*", False), ("sub>", False), (".lead", False),
                                    ("trail.", False), ("ünï", False)])
def test_only_nats_keys_are_looked_up(key, ok):
    assert valid_key(key) is ok
