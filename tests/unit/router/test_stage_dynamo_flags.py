"""The router's, preprocessor's and postprocessor's flags under Dynamo 1.6.1's spellings and env twins
(tests/golden/dynamo/frontend-help-1.6.1.txt), beside Meshfront's own, which keep working."""

from __future__ import annotations

import pytest

from services.postprocessor import config as post_config
from services.preprocessor import config as pre_config
from services.router import config as router_config

GOLDEN = "tests/golden/dynamo/frontend-help-1.6.1.txt"


def test_the_router_takes_dynamo_s_env_twins():
    cfg = router_config.parse_config([], {
        "DYN_ROUTER_MODE": "kv", "DYN_ROUTER_TEMPERATURE": "0.5", "DYN_ROUTER_USE_KV_EVENTS": "false",
        "DYN_ROUTER_TTL_SECS": "30", "DYN_ROUTER_REPLICA_SYNC": "false", "DYN_ROUTER_CONDITIONAL_DISAGG": "true",
        "DYN_ROUTER_CONDITIONAL_DISAGG_CONFIG": '{"eff_isl_threshold": 100}', "DYN_ENFORCE_DISAGG": "true",
        "DYN_ROUTER_MIN_INITIAL_WORKERS": "3"})
    assert (cfg.router_mode, cfg.router_temperature, cfg.router_kv_events) == ("kv", 0.5, False)
    assert cfg.router_ttl_secs == 30
    assert (cfg.router_replica_sync, cfg.router_conditional_disagg, cfg.enforce_disagg) == (False, True, True)
    assert cfg.disagg.eff_isl_threshold == 100 and cfg.router_min_initial_workers == 3


def test_meshfront_s_env_twin_wins_over_dynamo_s():
    cfg = router_config.parse_config([], {"DYN_ROUTER_MODE": "kv", "MESHFRONT_ROUTER_ROUTER_MODE": "random",
                                          "DYN_ROUTER_USE_KV_EVENTS": "false", "MESHFRONT_ROUTER_KV_EVENTS": "true"})
    assert cfg.router_mode == "random" and cfg.router_kv_events is True


@pytest.mark.parametrize("flag", ["--no-kv-events", "--no-router-kv-events"])
def test_kv_events_answers_to_both_spellings(flag):
    assert router_config.parse_config([flag], {}).router_kv_events is False
    assert router_config.parse_config([], {}).router_kv_events is True


def test_a_bad_dynamo_env_value_fails_the_start_naming_it(capsys):
    with pytest.raises(SystemExit) as e:
        router_config.parse_config([], {"DYN_ROUTER_MODE": "device-aware-weighted"})
    assert e.value.code == 2
    assert "DYN_ROUTER_MODE='device-aware-weighted'" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "env", "hidden"), [
    (["--no-exclude-tools-when-tool-choice-none"], {}, False),
    ([], {"DYN_EXCLUDE_TOOLS_WHEN_TOOL_CHOICE_NONE": "0"}, False),
    (["--no-hide-tools-for-tool-choice-none"], {}, False),
    ([], {}, True),
])
def test_the_preprocessor_s_tool_hiding_answers_to_dynamo_s_name(argv, env, hidden):
    assert pre_config.parse_config(argv, env).hide_tools_for_tool_choice_none is hidden


def test_the_postprocessor_takes_dynamo_s_migration_env_twins():
    cfg = post_config.parse_config([], {"DYN_MIGRATION_LIMIT": "1", "DYN_MIGRATION_MAX_SEQ_LEN": "4096"})
    assert (cfg.migration_limit, cfg.migration_max_seq_len) == (1, 4096)
    assert post_config.parse_config([], {}).migration_max_seq_len is None  # no limit unless set


@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_migration_max_seq_len_below_one_is_a_bad_value(value):
    with pytest.raises(ValueError, match=f"--migration-max-seq-len {value} must be >= 1"):
        post_config.parse_config(["--migration-max-seq-len", value], {})


def test_every_dynamo_name_used_here_is_in_dynamo_s_help():
    """A typo in a spelling or env twin would silently never match what a Dynamo deployment sets."""
    with open(GOLDEN) as f:
        golden = f.read()
    for name in ("--router-mode", "DYN_ROUTER_MODE", "DYN_ROUTER_TEMPERATURE", "--router-kv-events",
                 "DYN_ROUTER_USE_KV_EVENTS", "DYN_ROUTER_TTL_SECS", "DYN_ROUTER_REPLICA_SYNC",
                 "DYN_ROUTER_CONDITIONAL_DISAGG", "DYN_ROUTER_CONDITIONAL_DISAGG_CONFIG", "DYN_ENFORCE_DISAGG",
                 "--router-min-initial-workers", "DYN_ROUTER_MIN_INITIAL_WORKERS",
                 "--exclude-tools-when-tool-choice-none", "DYN_EXCLUDE_TOOLS_WHEN_TOOL_CHOICE_NONE",
                 "DYN_MIGRATION_LIMIT", "--migration-max-seq-len", "DYN_MIGRATION_MAX_SEQ_LEN",
                 "--dyn-debug-perf", "DYN_DEBUG_PERF"):
        assert f"{name} " in golden or f"{name}\n" in golden or f"{name}," in golden, name
