"""Chat rendering: byte-identical to transformers' apply_chat_template, plus our normalisation."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidRequest
from services.preprocessor.core.prompt import ChatInput, prepare_chat, render_chat_prompt
from services.preprocessor.core.templates import prompt_opens_reasoning

pytestmark = pytest.mark.unit

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

SYSTEM_USER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi! 你好 😀"}]

TOOL_ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"temp": 3}'},
]


def chat(messages, tools=None, tool_choice=None, **kwargs) -> ChatInput:
    return ChatInput(json.dumps(messages), json.dumps(tools) if tools is not None else "",
                     tool_choice == "none", json.dumps(kwargs) if kwargs else "")


def reference(hf_tokenizer, messages, tools=None, **kwargs):
    """What transformers renders for the already-normalised conversation (arguments as objects)."""
    return hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                            **kwargs)


def test_system_and_user_match_transformers(artifacts, hf_tokenizer):
    text = render_chat_prompt(artifacts, chat(SYSTEM_USER))
    assert text == reference(hf_tokenizer, SYSTEM_USER)
    assert text == "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi! 你好 😀<|im_end|>\n" \
                   "<|im_start|>assistant\n"


def test_token_ids_match_transformers(artifacts, hf_tokenizer):
    prepared = prepare_chat(artifacts, chat(SYSTEM_USER))
    expected = hf_tokenizer.apply_chat_template(SYSTEM_USER, tokenize=True, add_generation_prompt=True,
                                                return_dict=False)
    assert prepared.token_ids == list(expected)
    assert prepared.token_ids[0] == 151644  # <|im_start|> is one special token
    assert not prepared.prompt_opens_reasoning


def test_tool_round_trip(artifacts, hf_tokenizer):
    text = render_chat_prompt(artifacts, chat(TOOL_ROUND_TRIP, tools=[WEATHER_TOOL]))
    parsed = json.loads(json.dumps(TOOL_ROUND_TRIP))
    for call in parsed[1]["tool_calls"]:
        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    del parsed[1]["content"]
    assert text == reference(hf_tokenizer, parsed, tools=[WEATHER_TOOL])
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    # Arguments were parsed, so they render as an object, not a JSON-encoded string.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>' in text
    assert ('<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response>\n<tool_response>\n{"temp": 3}\n'
            '</tool_response><|im_end|>\n<|im_start|>assistant\n') in text


def test_tool_choice_none_hides_tools(artifacts):
    text = render_chat_prompt(artifacts, chat(SYSTEM_USER, tools=[WEATHER_TOOL], tool_choice="none"))
    assert "<tools>" not in text
    assert "<tools>" in render_chat_prompt(artifacts, chat(SYSTEM_USER, tools=[WEATHER_TOOL], tool_choice="auto"))


def test_tools_without_parameters_render(artifacts):
    tool = {"type": "function", "function": {"name": "now"}}
    text = render_chat_prompt(artifacts, chat(SYSTEM_USER, tools=[tool]))
    assert '{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}' \
        in text


def test_enable_thinking_false(artifacts, hf_tokenizer):
    text = render_chat_prompt(artifacts, chat(SYSTEM_USER, enable_thinking=False))
    assert text == reference(hf_tokenizer, SYSTEM_USER, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning(text)


def test_reasoning_of_the_current_turn_is_kept(artifacts):
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "reasoning_content": "step 1", "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "content": "ok"}]
    text = render_chat_prompt(artifacts, chat(messages, tools=[WEATHER_TOOL]))
    assert "<|im_start|>assistant\n<think>\nstep 1\n</think>\n\n<tool_call>" in text


def test_reasoning_of_earlier_turns_is_dropped(artifacts):
    messages = [{"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1", "reasoning_content": "old thoughts"},
                {"role": "user", "content": "q2"}]
    text = render_chat_prompt(artifacts, chat(messages))
    assert "old thoughts" not in text
    assert "<|im_start|>assistant\na1<|im_end|>" in text


def test_content_parts_are_flattened(artifacts):
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert "<|im_start|>user\na\nb<|im_end|>" in render_chat_prompt(artifacts, chat(messages))


def test_prompt_that_opens_think_is_detected(load_variant):
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    a = load_variant({"chat_template.jinja": template})
    prepared = prepare_chat(a, chat(SYSTEM_USER))
    assert prepared.prompt_opens_reasoning
    assert prepared.token_ids[-2:] == [151667, 198]  # "<think>", "\n"


def test_special_tokens_reach_the_template(load_variant):
    a = load_variant({"chat_template.jinja": "{{ bos_token }}|{{ eos_token }}|{{ messages[0].content }}",
                      "tokenizer_config.json": {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}})
    assert render_chat_prompt(a, chat(SYSTEM_USER)) == "<|endoftext|>|<|im_end|>|You are terse."


def test_kwargs_may_override_special_tokens_and_generation_prompt(artifacts, load_variant):
    a = load_variant({"chat_template.jinja": "{{ eos_token }}{% if add_generation_prompt %}+{% endif %}",
                      "tokenizer_config.json": {"eos_token": "<|im_end|>"}})
    assert render_chat_prompt(a, chat(SYSTEM_USER)) == "<|im_end|>+"
    assert render_chat_prompt(a, chat(SYSTEM_USER, eos_token="X", add_generation_prompt=False)) == "X"


@pytest.mark.parametrize("key", ["chat_template", "messages", "tools"])
def test_kwargs_cannot_replace_the_template_or_inputs(artifacts, key):
    with pytest.raises(InvalidRequest, match=key) as e:
        render_chat_prompt(artifacts, ChatInput(json.dumps(SYSTEM_USER),
                                                chat_template_kwargs_json=json.dumps({key: "{{ 7 * 7 }}"})))
    assert e.value.param == "chat_template_kwargs"


def test_raise_exception_becomes_invalid_request(load_variant):
    a = load_variant({"chat_template.jinja": "{{ raise_exception('roles must alternate') }}"})
    with pytest.raises(InvalidRequest, match="roles must alternate"):
        render_chat_prompt(a, chat(SYSTEM_USER))


def test_sandbox_blocks_attribute_escapes(load_variant):
    a = load_variant({"chat_template.jinja": "{{ ''.__class__.__mro__[1].__subclasses__() }}"})
    with pytest.raises(InvalidRequest):
        render_chat_prompt(a, chat(SYSTEM_USER))


def test_model_without_template_rejects_chat(load_variant):
    with pytest.raises(InvalidRequest, match="no chat template"):
        render_chat_prompt(load_variant({}), chat(SYSTEM_USER))


@pytest.mark.parametrize(("field", "param"), [("messages_json", "messages"), ("tools_json", "tools"),
                                              ("chat_template_kwargs_json", "chat_template_kwargs")])
def test_invalid_json(artifacts, field, param):
    fields = {"messages_json": json.dumps(SYSTEM_USER), field: "{broken"}
    with pytest.raises(InvalidRequest) as e:
        render_chat_prompt(artifacts, ChatInput(**fields))
    assert e.value.param == param


def test_a_template_failing_on_odd_messages_says_so_without_jinjas_python_text(load_variant):
    a = load_variant({"chat_template.jinja":
                      "{% for m in messages %}{{ m.tool_calls[0].function.name.upper() }}{% endfor %}"})
    messages = [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": "f"}]}]
    with pytest.raises(InvalidRequest) as e:
        render_chat_prompt(a, chat(messages))
    assert e.value.param == "messages" and "cannot render these messages" in e.value.message
    assert "str object" not in e.value.message and "attribute" not in e.value.message
