"""The names workers may register are exactly the parsers the postprocessor implements."""

import pytest

from services.common.flags import FlagParser
from services.common.parser_names import REASONING_PARSER_NAMES, TOOL_CALL_PARSER_NAMES
from services.postprocessor.core.parsers.output import ParserConfig, build_output_parser
from services.postprocessor.core.parsers.reasoning import REASONING_NAMES
from services.postprocessor.core.parsers.tool_calls import TOOL_CALL_PARSERS
from services.workers.config import add_worker_flags

pytestmark = pytest.mark.unit


def test_worker_names_equal_the_postprocessor_registries():
    assert set(TOOL_CALL_PARSER_NAMES) == set(TOOL_CALL_PARSERS)
    assert set(REASONING_PARSER_NAMES) == set(REASONING_NAMES)


@pytest.mark.parametrize("flag", ["--tool-call-parser", "--reasoning-parser"])
def test_a_worker_with_an_unknown_parser_name_fails_at_start(flag, capsys):
    p = FlagParser("mocker", "", {})
    add_worker_flags(p)
    with pytest.raises(SystemExit) as info:
        p.parse(["--model-dir", "/m", flag, "hermes3"])
    assert info.value.code == 2
    assert "hermes3" in capsys.readouterr().err


def test_an_unknown_name_at_request_time_is_an_error_not_a_silent_no_op():
    with pytest.raises(LookupError, match="'nope'"):
        build_output_parser(ParserConfig("nope", has_tools=True))
    with pytest.raises(LookupError, match="'nope'"):
        build_output_parser(ParserConfig(reasoning_parser="nope"))


NEW_FAMILIES = [("--tool-call-parser", name) for name in
                ("qwen3_coder", "kimi_k2", "glm45", "glm47", "minimax_m2", "deepseek_v32")] + \
               [("--reasoning-parser", name) for name in ("kimi_k2", "minimax", "nemotron", "granite")]


@pytest.mark.parametrize(("flag", "name"), NEW_FAMILIES)
def test_a_worker_accepts_the_current_families_by_flag_and_by_env_twin(flag, name, demo_model_dir):
    from services.workers.mocker import config as mocker_config

    field = flag.lstrip("-").replace("-", "_")
    by_flag = mocker_config.parse_config(["--model-dir", str(demo_model_dir), flag, name], {})
    env = {f"MESHFRONT_MOCKER_{field.upper()}": name}
    by_env = mocker_config.parse_config(["--model-dir", str(demo_model_dir)], env)
    assert getattr(by_flag.worker, field) == getattr(by_env.worker, field) == name


def test_the_workers_thinking_markers_are_the_reasoning_parsers_own():
    """A thinking budget is enforced by forcing the closing marker the postprocessor's parser ends reasoning at;
    every parser whose block is one opening and one closing tag is listed, and only those."""
    from services.common.parser_names import THINKING_BLOCKS
    from services.postprocessor.core.parsers.reasoning import REASONING_PARSERS

    tagged = {name: (cls.open_tag, cls.close_tag) for name, cls in REASONING_PARSERS.items()
              if not cls.open_tags and not cls.close_tags}
    assert tagged == THINKING_BLOCKS
