"""Every flag of Dynamo's captured frontend help is honoured or refused, and docs/dynamo-flags.md says which."""

from __future__ import annotations

import pytest

from services.frontend import flag_table
from services.frontend.config import ConfigError, parse
from services.frontend.dynamo_help import dynamo_flags
from services.frontend.refusals import REFUSED


def test_the_capture_has_every_flag_dynamo_1_6_1_documents():
    flags = dynamo_flags()
    assert len(flags) == 98
    by_flag = {f.flag: f for f in flags}
    assert by_flag["--router-kv-events"].spellings == ("--router-kv-events", "--no-router-kv-events", "--kv-events",
                                                        "--no-kv-events")
    assert by_flag["--router-kv-events"].env == "DYN_ROUTER_USE_KV_EVENTS"
    assert by_flag["--interactive"].spellings[0] == "-i"
    assert by_flag["--nats-tls-insecure"].env == "NATS_TLS_INSECURE"
    assert by_flag["--ais-backend"].aliases == ("--aic-backend",)


def test_every_dynamo_flag_spelling_and_env_twin_is_honoured_or_refused():
    drift = [(r.dynamo.flag, r.status, r.missing) for r in flag_table.rows() if r.status == "missing" or r.missing]
    assert drift == []


def test_the_generated_table_is_current():
    assert flag_table.DOC.read_text() == flag_table.render(), \
        "docs/dynamo-flags.md is stale: python -m services.frontend.flag_table"


def test_every_refusal_names_a_flag_dynamo_has():
    assert set(REFUSED) <= {f.flag for f in dynamo_flags()}


def _rejecting_value(flag: str) -> list[str]:
    dynamo = next(f for f in dynamo_flags() if f.flag == flag)
    if not dynamo.takes_value:
        accepted = REFUSED[flag].accepts
        return [flag] if accepted == ("False",) or not accepted else [f"--no-{flag[2:]}"]
    return [flag, "not-an-accepted-value"]


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_a_refused_flag_is_one_line_naming_it_and_what_to_do_instead(flag):
    with pytest.raises(ConfigError) as e:
        parse(_rejecting_value(flag), env={})
    line = str(e.value)
    assert "\n" not in line and line.startswith(flag) and "instead:" in line


@pytest.mark.parametrize("flag", sorted(f for f, r in REFUSED.items() if r.accepts))
def test_a_refused_flag_given_a_value_meshfront_honours_anyway_passes(flag):
    value = REFUSED[flag].accepts[0]
    dynamo = next(f for f in dynamo_flags() if f.flag == flag)
    argv = ([flag] if value == "True" else [f"--no-{flag[2:]}"]) if not dynamo.takes_value else [flag, value]
    parse(argv, env={})


def test_a_refused_flags_env_twin_is_refused_too():
    with pytest.raises(ConfigError, match="--request-plane tcp: not supported"):
        parse([], env={"DYN_REQUEST_PLANE": "tcp"})
    with pytest.raises(ConfigError, match="--event-plane zmq"):
        parse([], env={"DYN_EVENT_PLANE": "zmq"})
    parse([], env={"DYN_EVENT_PLANE": "nats"})


def test_a_router_mode_meshfront_lacks_is_refused_with_its_reason():
    with pytest.raises(ConfigError, match="--router-mode device-aware-weighted: not supported"):
        parse(["--router-mode", "device-aware-weighted"], env={})
    with pytest.raises(ConfigError, match="--router-mode device-aware-weighted"):
        parse([], env={"DYN_ROUTER_MODE": "device-aware-weighted"})
