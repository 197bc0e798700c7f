"""Conditional disaggregation (services/router/core/conditional.py): Dynamo's policies and thresholds,
each decision's reason, and the flags' checks."""

from __future__ import annotations

import pytest

from services.router.config import parse_config
from services.router.core.conditional import (
    CACHED_PROMPT,
    DECODE_BUSY,
    DISAGGREGATED,
    PREFILL_BUSY,
    SHORT_PROMPT,
    DisaggSettings,
    SplitInput,
    decide,
    parse_settings,
)

pytestmark = pytest.mark.unit


def x(prompt=1000, cached=0, waiting=0, batch=8192, active=10, total=1000) -> SplitInput:
    return SplitInput(prompt_tokens=prompt, decode_cached_tokens=cached, prefill_waiting_tokens=waiting,
                      prefill_batch_tokens=batch, decode_active_blocks=active, decode_total_blocks=total)


ISL = DisaggSettings(conditional=True)


def test_off_always_splits_whatever_the_request():
    off = DisaggSettings(conditional=False, max_local_prefill_length=10_000, prefill_busy_threshold=0.0)
    assert decide(off, x(prompt=10, cached=10, waiting=10**6)) == DISAGGREGATED


@pytest.mark.parametrize(("prompt", "cached", "reason"), [
    (1000, 896, CACHED_PROMPT),  # eff 104 < 2048, ratio 0.104 < 0.7 (Dynamo's own example)
    (100_000, 64_000, DISAGGREGATED),  # eff 36k >= 2048 even though the ratio is low
    (200, 0, DISAGGREGATED),  # short but nothing cached: ratio 1.0 >= 0.7
    (2048 + 100, 100, DISAGGREGATED),  # eff exactly the threshold: strict <
    (1000, 301, CACHED_PROMPT),  # ratio 0.699
    (1000, 300, DISAGGREGATED),  # ratio exactly 0.7: strict <
])
def test_isl_bounding_keeps_small_mostly_cached_prompts_aggregated(prompt, cached, reason):
    assert decide(ISL, x(prompt=prompt, cached=cached)) == reason


def test_max_local_prefill_length_keeps_a_short_fresh_prompt_aggregated_whatever_its_ratio():
    short = DisaggSettings(conditional=True, max_local_prefill_length=256)
    assert decide(short, x(prompt=256, cached=0)) == SHORT_PROMPT
    assert decide(short, x(prompt=257, cached=0)) == DISAGGREGATED
    assert decide(short, x(prompt=300, cached=64)) == SHORT_PROMPT  # what is left to compute counts
    assert decide(short, x(prompt=300, cached=100)) == CACHED_PROMPT  # mostly cached: Dynamo's reason first
    load_only = DisaggSettings(conditional=True, policy="prefill_load", prefill_busy_threshold=1.0,
                               max_local_prefill_length=256)
    assert decide(load_only, x(prompt=10)) == DISAGGREGATED  # an ISL key: prefill_load ignores it


def test_prefill_load_keeps_requests_off_a_busy_prefill_worker():
    load = DisaggSettings(conditional=True, policy="prefill_load", prefill_busy_threshold=0.5)
    assert decide(load, x(waiting=4097, batch=8192)) == PREFILL_BUSY
    assert decide(load, x(waiting=4096, batch=8192)) == DISAGGREGATED  # strict >
    assert decide(load, x(waiting=10**6, batch=0)) == DISAGGREGATED  # capacity unknown: calm, as in Dynamo
    assert decide(load, x(prompt=1000, cached=999)) == DISAGGREGATED  # prefill_load ignores the cache


def test_isl_or_load_takes_either():
    both = DisaggSettings(conditional=True, policy="isl_or_load", prefill_busy_threshold=1.0)
    assert decide(both, x(prompt=1000, cached=900)) == CACHED_PROMPT
    assert decide(both, x(prompt=1000, waiting=9000)) == PREFILL_BUSY
    assert decide(both, x(prompt=1000)) == DISAGGREGATED


def test_a_busy_decode_worker_vetoes_any_bypass():
    guard = DisaggSettings(conditional=True, policy="isl_or_load", prefill_busy_threshold=1.0,
                           decode_busy_threshold=0.8)
    assert decide(guard, x(prompt=1000, cached=900, active=801, total=1000)) == DECODE_BUSY
    assert decide(guard, x(prompt=1000, cached=900, active=800, total=1000)) == CACHED_PROMPT
    assert decide(guard, x(prompt=1000, waiting=9000, active=900, total=1000)) == DECODE_BUSY
    # No KV capacity reported: the guard cannot tell, so the request is split (Dynamo's fallback).
    assert decide(guard, x(prompt=1000, cached=900, total=0)) == DECODE_BUSY
    # Nothing to veto: the guard does not turn a split into anything else.
    assert decide(guard, x(prompt=1000, active=999, total=1000)) == DISAGGREGATED


def test_the_config_takes_dynamos_keys_and_ours():
    s = parse_settings(True, '{"policy":"isl_or_load","eff_isl_threshold":4096,"eff_isl_ratio_threshold":0.8,'
                             '"prefill_busy_threshold":16,"decode_busy_threshold":0.9,"max_local_prefill_length":64}',
                       enforce=True)
    assert s == DisaggSettings(True, "isl_or_load", 4096, 0.8, 16, 0.9, 64, True)
    assert parse_settings(False, "", False) == DisaggSettings()


@pytest.mark.parametrize(("raw", "says"), [
    ("[1]", "must be a JSON object"),
    ("{", "is not JSON"),
    ('{"eff_isl":1}', "no key 'eff_isl'"),
    ('{"eff_isl_threshold":"1"}', "eff_isl_threshold must be a int"),
    ('{"eff_isl_threshold":true}', "eff_isl_threshold must be a int"),
    ('{"policy":"always"}', "policy 'always' must be one of"),
    ('{"eff_isl_ratio_threshold":1.5}', "eff_isl_ratio_threshold must be in [0.0, 1.0]"),
    ('{"eff_isl_threshold":-1}', "eff_isl_threshold must be >= 0"),
    ('{"decode_busy_threshold":2}', "decode_busy_threshold must be in [0.0, 1.0]"),
    ('{"policy":"prefill_load"}', "needs prefill_busy_threshold"),
])
def test_a_bad_config_fails_the_start_naming_what(raw, says):
    with pytest.raises(ValueError, match=r".*" + says.replace("[", r"\[").replace("]", r"\]")):
        parse_config(["--router-conditional-disagg", "--router-conditional-disagg-config", raw], env={})


def test_router_flags_and_env_twins():
    cfg = parse_config([], env={"MESHFRONT_ROUTER_ROUTER_CONDITIONAL_DISAGG": "1",
                                "MESHFRONT_ROUTER_ROUTER_CONDITIONAL_DISAGG_CONFIG": '{"eff_isl_threshold": 512}',
                                "MESHFRONT_ROUTER_ENFORCE_DISAGG": "true"})
    assert cfg.disagg == DisaggSettings(conditional=True, eff_isl_threshold=512, enforce=True)
    assert parse_config([], env={}).disagg == DisaggSettings()
