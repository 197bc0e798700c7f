"""Dynamo's thinking rules per family (services/preprocessor/core/thinking.py); Dynamo's own split of the
same requests is checked in tests/unit/parsers/test_dynamo_goldens.py (golden thinking.json)."""

from __future__ import annotations

import pytest

from services.preprocessor.core.thinking import apply_default_thinking_mode, forces_reasoning, thinking_off

pytestmark = pytest.mark.unit


def test_deployment_default_fills_every_thinking_kwarg_unless_the_request_controls_thinking():
    assert apply_default_thinking_mode({"x": 1}, "disabled") == {
        "x": 1, "thinking": False, "enable_thinking": False, "thinking_mode": "disabled"}
    assert apply_default_thinking_mode({}, "enabled") == {
        "thinking": True, "enable_thinking": True, "thinking_mode": "enabled"}
    for own in ({"enable_thinking": True}, {"thinking": True}, {"thinking_mode": "x"}, {"reasoning_effort": "low"}):
        assert apply_default_thinking_mode(own, "disabled") == own
    assert apply_default_thinking_mode({"x": 1}, "") == {"x": 1}


@pytest.mark.parametrize("kwargs, off", [({}, True), ({"reasoning_effort": "none"}, True),
                                         ({"reasoning_effort": "high"}, False), ({"enable_thinking": True}, True)])
def test_mistral_thinks_only_with_a_reasoning_effort(kwargs, off):
    assert thinking_off("mistral", kwargs) is off


@pytest.mark.parametrize("name", ["minimax_m3", "minimax-m3"])
def test_minimax_m3_is_adaptive_unless_disabled(name):
    assert not thinking_off(name, {})
    assert not thinking_off(name, {"enable_thinking": False})
    assert thinking_off(name, {"thinking_mode": "disabled"})


@pytest.mark.parametrize("name, flag", [("deepseek_v3", "thinking"), ("deepseek_v4", "thinking"),
                                        ("gemma4", "enable_thinking")])
def test_opt_in_families_think_only_when_asked(name, flag):
    assert thinking_off(name, {})
    assert thinking_off(name, {flag: False})
    assert not thinking_off(name, {flag: True})
    assert forces_reasoning(name, {flag: True}) is (flag == "thinking")  # DeepSeek's template opens <think>
    assert not forces_reasoning(name, {})


def test_kimi_k2_stops_on_thinking_false_only():
    assert thinking_off("kimi_k2", {"thinking": False})
    assert not thinking_off("kimi_k2", {"enable_thinking": False})
    assert not thinking_off("kimi_k2", {})


@pytest.mark.parametrize("kwargs", [{"enable_thinking": False}, {"thinking": False}, {"thinking_mode": "chat"},
                                    {"thinking_mode": "disabled"}])
def test_other_families_think_unless_turned_off(kwargs):
    assert not thinking_off("qwen3", {})
    assert thinking_off("qwen3", kwargs)
    assert thinking_off("deepseek_r1", kwargs)
    assert not forces_reasoning("qwen3", {"thinking": True})
