"""The pure core of --auth: secrets and their hashes, key records, quota windows and the rate-limit headers."""

from __future__ import annotations

import hashlib

import pytest

from services.gateway.auth import quota
from services.gateway.auth.keys import KeyRecord, hash_secret, key_id, new_secret, presented_secret
from services.gateway.auth.quota import QuotaState, Refusal
from services.gateway.auth.usage import Totals, summed

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0


def test_a_secret_is_random_and_kept_only_as_its_sha256():
    a, b = new_secret(), new_secret()
    assert a != b and a.startswith("mf-") and len(a) == 3 + 43
    assert hash_secret(a) == hashlib.sha256(a.encode()).hexdigest()
    assert key_id(hash_secret(a)) == "key_" + hash_secret(a)[:12]
    assert a not in key_id(hash_secret(a))


@pytest.mark.parametrize(("headers", "anthropic", "want"), [
    ({"authorization": "Bearer mf-x"}, False, "mf-x"),
    ({"authorization": "bearer  mf-x "}, False, "mf-x"),
    ({"authorization": "Basic mf-x"}, False, ""),
    ({"x-api-key": "mf-y"}, False, ""),  # x-api-key is Anthropic's, on /v1/messages only
    ({"x-api-key": "mf-y"}, True, "mf-y"),
    ({"authorization": "Bearer mf-x"}, True, "mf-x"),
    ({}, True, ""),
])
def test_the_presented_secret(headers, anthropic, want):
    assert presented_secret(headers, anthropic=anthropic) == want


def test_a_record_round_trips_and_says_what_it_allows():
    r = KeyRecord("key_1", "team-a", "premium", rpm=5, tpm=100, max_concurrency=2, models=("m1",), created_at=T0)
    assert KeyRecord.from_json(r.to_json()) == r
    assert r.limited and r.allows("m1") and not r.allows("m2")
    assert KeyRecord("key_2", "b").allows("anything") and not KeyRecord("key_2", "b").limited
    assert KeyRecord("k", "no.dots").errors() and KeyRecord("k", "_mesh").errors()
    assert KeyRecord("k", "a", rpm=-1).errors() == ["--rpm must be 0 (no limit) or more; got -1"]


def test_rpm_admits_the_limit_then_refuses_until_the_window_ends():
    key = KeyRecord("k", "t", rpm=5)
    state = QuotaState()
    for i in range(5):
        out = quota.admit(state, key, "r1", T0 + i)
        assert isinstance(out, QuotaState)
        state = out
    refused = quota.admit(state, key, "r2", T0 + 10)
    assert isinstance(refused, Refusal) and refused.reason == "requests"
    assert refused.retry_after_s == 50 and refused.quota.requests_left == 0
    # The window started with the first request: 60 s later a new one starts.
    again = quota.admit(QuotaState.from_json(state.to_json()), key, "r2", T0 + 60)
    assert isinstance(again, QuotaState) and again.requests == 1 and again.window_start == T0 + 60


def test_tokens_refuse_once_the_window_has_used_its_tpm():
    key = KeyRecord("k", "t", tpm=100)
    state = quota.admit(QuotaState(), key, "r1", T0)
    assert isinstance(state, QuotaState)
    state = quota.charged(state, 60, "r1", T0 + 1, release=False)
    assert isinstance(quota.admit(state, key, "r1", T0 + 2), QuotaState)  # 60 < 100: admitted
    state = quota.charged(state, 50, "r1", T0 + 3, release=True)  # ends above tpm: in-flight usage is charged
    refused = quota.admit(state, key, "r1", T0 + 4)
    assert isinstance(refused, Refusal) and refused.reason == "tokens" and refused.quota.tokens_left == 0


def test_concurrency_counts_slots_across_replicas_and_forgets_a_dead_one():
    key = KeyRecord("k", "t", max_concurrency=2)
    state = quota.admit(QuotaState(), key, "r1", T0)
    assert isinstance(state, QuotaState)
    state = quota.admit(state, key, "r2", T0)
    assert isinstance(state, QuotaState) and state.in_flight() == 2
    refused = quota.admit(state, key, "r1", T0 + 1)
    assert isinstance(refused, Refusal) and refused.reason == "concurrency"
    released = quota.charged(state, 0, "r2", T0 + 2, release=True)
    assert released.in_flight() == 1 and "r2" not in released.slots
    # r1 died holding its slot: forgotten once its stamp is STALE_SLOT_S old.
    later = quota.admit(released, key, "r2", T0 + quota.STALE_SLOT_S + 1)
    assert isinstance(later, QuotaState) and later.in_flight() == 1


def test_openai_and_anthropic_headers_name_only_the_limits_a_key_has():
    s = quota.Snapshot(rpm=5, requests_left=3, tpm=0, tokens_left=0, reset_s=42.2)
    assert dict(quota.openai_headers(s)) == {"x-ratelimit-limit-requests": "5", "x-ratelimit-remaining-requests": "3",
                                             "x-ratelimit-reset-requests": "43s"}
    both = quota.Snapshot(rpm=5, requests_left=3, tpm=1000, tokens_left=10, reset_s=75)
    assert dict(quota.openai_headers(both))["x-ratelimit-reset-tokens"] == "1m15s"
    assert dict(quota.anthropic_headers(both, T0)) == {
        "anthropic-ratelimit-requests-limit": "5", "anthropic-ratelimit-requests-remaining": "3",
        "anthropic-ratelimit-requests-reset": "2027-01-15T08:01:15Z",
        "anthropic-ratelimit-tokens-limit": "1000", "anthropic-ratelimit-tokens-remaining": "10",
        "anthropic-ratelimit-tokens-reset": "2027-01-15T08:01:15Z"}
    assert quota.go_duration(0.25) == "250ms"


def test_usage_sums_every_replica_record_of_a_tenant():
    a = Totals(3, 30, 60, {"requests": 1})
    b = Totals(2, 20, 40, {"requests": 2, "tokens": 1})
    out = summed([("t1.gw-1", a.to_json()), ("t1.gw-2", b.to_json()), ("t2.gw-1", Totals(1).to_json())])
    assert out["t1"] == Totals(5, 50, 100, {"requests": 3, "tokens": 1}) and out["t2"].requests == 1
