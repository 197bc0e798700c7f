"""tool_choice is decided once, in the gateway, and carried as a typed message."""

import orjson
import pytest
from meshfront.common.v1 import common_pb2

from services.gateway.core.openai_request import parse_chat
from services.gateway.core.to_proto import chat_to_preprocess

pytestmark = pytest.mark.unit

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def _carried(choice) -> common_pb2.ToolChoice | None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]}
    if choice is not None:
        body["tool_choice"] = choice
    prep = chat_to_preprocess(parse_chat(orjson.dumps(body)), "r")
    return prep.tool_choice if prep.HasField("tool_choice") else None


@pytest.mark.parametrize(("choice", "mode"), [("auto", common_pb2.TOOL_CHOICE_MODE_AUTO),
                                              ("none", common_pb2.TOOL_CHOICE_MODE_NONE),
                                              ("required", common_pb2.TOOL_CHOICE_MODE_REQUIRED)])
def test_string_choices_become_modes(choice, mode):
    carried = _carried(choice)
    assert carried is not None and (carried.mode, carried.function_name) == (mode, "")


def test_a_named_function_carries_its_name():
    carried = _carried({"type": "function", "function": {"name": "get_weather"}})
    assert carried is not None
    assert (carried.mode, carried.function_name) == (common_pb2.TOOL_CHOICE_MODE_NAMED, "get_weather")


def test_no_choice_is_unset_so_the_default_applies_downstream():
    assert _carried(None) is None
