"""Dynamo's structural-tag worker flags (services/workers/structural_tags.py), the card that carries them, and
the mocker's answer for a tag that forces calls (services/workers/mocker/guided.py)."""

from __future__ import annotations

import itertools

import orjson
import pytest

from services.postprocessor.core.parsers import ParserConfig, build_output_parser
from services.preprocessor.core import structural_tag as st
from services.workers.config import ConfigError
from services.workers.mocker.config import parse_config
from services.workers.mocker.guided import structural_text
from services.workers.server import worker_card

pytestmark = pytest.mark.unit

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}]


def settings(demo_model_dir, *flags: str, env: dict[str, str] | None = None):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--no-register", *flags], env=env or {})
    return cfg.worker.structural_tags


@pytest.mark.parametrize(("flags", "env", "expected"), [
    ((), {}, ("off", "always", "auto")),
    (("--dyn-structural-tag", "on"), {}, ("on", "always", "auto")),
    (("--structural-tag-mode", "on", "--structural-tag-scope", "auto"), {}, ("on", "auto", "auto")),
    (("--dyn-structural-tag", '{"scope": "auto", "schema": "strict"}'), {}, ("on", "auto", "strict")),
    (("--dyn-enable-structural-tag", "--dyn-structural-tag-schema", "strict"), {}, ("on", "always", "strict")),
    ((), {"DYN_STRUCTURAL_TAG": "true", "DYN_STRUCTURAL_TAG_SCOPE": "auto"}, ("on", "auto", "auto")),
    (("--dyn-structural-tag", "off"), {"DYN_ENABLE_STRUCTURAL_TAG": "false"}, ("off", "always", "auto")),
])
def test_dynamos_spellings_and_env_twins(demo_model_dir, flags, env, expected):
    s = settings(demo_model_dir, *flags, env=env)
    assert (s.mode, s.scope, s.schema) == expected


def test_the_card_carries_the_settings(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--no-register", "--tool-call-parser", "hermes",
                        "--dyn-structural-tag", '{"scope": "auto"}'], env={})
    card = worker_card(cfg.worker, "h:1").model
    assert (card.structural_tag_mode, card.structural_tag_scope, card.structural_tag_schema) == ("on", "auto", "auto")


def test_json_with_the_older_scope_flag_is_refused_as_dynamo_does(demo_model_dir):
    with pytest.raises(ConfigError, match="cannot be combined with --dyn-structural-tag-scope"):
        settings(demo_model_dir, "--dyn-structural-tag", "{}", "--dyn-structural-tag-scope", "auto")


@pytest.mark.parametrize(("value", "message"), [
    ("maybe", "on, off or a JSON object"),
    ('{"scpoe": "auto"}', "unknown key"),
    ('{"tool_arguments_any_order": true}', "not supported by Meshfront"),
    ('{"scope": "sometimes"}', "scope must be one of"),
])
def test_a_bad_value_exits_2_with_one_line(demo_model_dir, capsys, value, message):
    with pytest.raises(SystemExit) as exit_:
        settings(demo_model_dir, "--dyn-structural-tag", value)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder", "kimi_k2", "llama3_json", "deepseek_v3",
                                    "deepseek_v3_1", "minimax_m2"])
def test_the_mockers_answer_to_a_forced_tag_is_a_call_the_models_parser_reads(parser):
    tag = st.build(parser, TOOLS, st.NAMED, "get_weather", reasoning_open=parser == "hermes")
    text = structural_text(orjson.dumps(tag).decode())
    counter = itertools.count()
    out = build_output_parser(ParserConfig(parser, has_tools=True), lambda: f"call_{next(counter)}",
                              orjson.dumps(TOOLS).decode())
    assert out is not None and text is not None
    deltas = [out.feed(text), out.finish()]
    calls = [c for d in deltas for c in d.tool_calls]
    assert calls[0].name == "get_weather"
    arguments = orjson.loads("".join(c.arguments for c in calls))
    assert set(arguments) == {"city", "days"} and isinstance(arguments["days"], int)
    assert "".join(d.content for d in deltas).strip() in ("", "</think>")


def test_a_tag_that_leaves_text_free_is_answered_by_the_script():
    assert structural_text(orjson.dumps(st.build("hermes", TOOLS, st.AUTO)).decode()) is None
