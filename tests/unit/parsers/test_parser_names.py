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
