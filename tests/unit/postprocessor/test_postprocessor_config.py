"""Config parsing and the proto <-> core conversions."""

from __future__ import annotations

import pytest
from meshfront.common.v1 import common_pb2

from services.postprocessor import convert
from services.postprocessor.config import DEFAULT_PORT, parse_config
from services.postprocessor.core.sequence import FinishReason

pytestmark = pytest.mark.unit


def test_defaults_flags_and_env_twins():
    cfg = parse_config([], {})
    assert (cfg.port, cfg.host, cfg.drain_grace_s) == (DEFAULT_PORT, "127.0.0.1", 10.0)
    assert parse_config(["--port", "0"], {"MESHFRONT_POSTPROCESSOR_PORT": "9500"}).port == 0
    assert parse_config([], {"MESHFRONT_POSTPROCESSOR_DRAIN_GRACE_S": "2.5"}).drain_grace_s == 2.5


def test_invalid_settings_fail_at_startup():
    with pytest.raises(ValueError, match="port.*drain"):
        parse_config(["--port", "70000", "--drain-grace-s", "-1"], {})


def test_finish_reasons_match_the_proto_enum():
    for reason in FinishReason:
        assert common_pb2.FinishReason.Name(int(reason)) == f"FINISH_REASON_{reason.name}"
        assert convert.finish_from_proto(convert.finish_to_proto(reason)) is reason
    assert convert.finish_from_proto(common_pb2.FINISH_REASON_UNSPECIFIED) is None


def test_sequence_options_hide_eos_ids_unless_ignore_eos():
    req = common_pb2.PreprocessedRequest(token_ids=list(range(100)), eos_token_ids=[7])
    req.stop.stop.extend(["x", "y"])
    req.stop.stop_token_ids_hidden.append(9)
    req.stop.min_tokens = 3
    req.stop.include_stop_str_in_output = True
    req.output.skip_special_tokens = True
    opts = convert.sequence_options(req)
    assert opts.hidden_stop_ids == {7, 9}
    assert (opts.stop_strings, opts.include_stop_str, opts.min_tokens, opts.skip_special_tokens) == (
        ("x", "y"), True, 3, True)
    assert list(opts.prompt_ids) == list(range(95, 100))
    req.stop.ignore_eos = True
    assert convert.sequence_options(req).hidden_stop_ids == frozenset()
