"""Schemas of the Anthropic Messages routes (POST /v1/messages, POST /v1/messages/count_tokens)."""

from __future__ import annotations

from services.gateway.http_api.schema import Schema, array, boolean, integer, map_of, number, obj, one_of, ref, string

TEXT_BLOCK = obj({"type": string(enum=("text",)), "text": string()}, required=("type", "text"), extra=True)
CONTENT_BLOCK = obj({
    "type": string(enum=("text", "tool_use", "tool_result", "thinking")),
    "text": string(), "id": string(), "name": string(), "input": map_of({}),
    "tool_use_id": string(), "content": one_of(string(), array(TEXT_BLOCK)), "is_error": boolean(),
    "thinking": string(), "signature": string(),
}, "A text, tool_use, tool_result or thinking block", required=("type",), extra=True)
MESSAGE = obj({"role": string(enum=("user", "assistant")),
               "content": one_of(string(), array(ref("AnthropicContentBlock")))},
              required=("role", "content"))
TOOL = obj({"name": string(), "description": string(), "input_schema": map_of({}, "A JSON schema")},
           required=("name", "input_schema"), extra=True)
TOOL_CHOICE = obj({"type": string(enum=("auto", "any", "tool", "none")), "name": string(),
                   "disable_parallel_tool_use": boolean()}, required=("type",))
SYSTEM = one_of(string(), array(TEXT_BLOCK), description="The system prompt")
THINKING = obj({"type": string(enum=("enabled", "disabled")), "budget_tokens": integer(minimum=0)},
               required=("type",))

MESSAGES_REQUEST = obj({
    "model": string(),
    "messages": array(ref("AnthropicMessage"), minItems=1),
    "max_tokens": integer(minimum=1),
    "system": SYSTEM,
    "stream": boolean("Stream events: message_start, content_block_start/delta/stop, message_delta, "
                      "message_stop"),
    "stop_sequences": array(string()),
    "temperature": number(minimum=0, maximum=1),
    "top_p": number(minimum=0, maximum=1),
    "top_k": integer(minimum=1),
    "tools": array(ref("AnthropicTool")),
    "tool_choice": TOOL_CHOICE,
    "thinking": THINKING,
    "metadata": obj({"user_id": string()}),
}, "POST /v1/messages", required=("model", "messages", "max_tokens"))
USAGE = obj({"input_tokens": integer(), "output_tokens": integer(),
             "cache_read_input_tokens": integer("Prompt tokens served from a worker's KV cache")},
            required=("input_tokens", "output_tokens"))
MESSAGES_RESPONSE = obj({
    "id": string("msg_..."), "type": string(enum=("message",)), "role": string(enum=("assistant",)),
    "model": string(), "content": array(ref("AnthropicContentBlock")),
    "stop_reason": string(enum=("end_turn", "max_tokens", "stop_sequence", "tool_use"), nullable=True),
    "stop_sequence": string(nullable=True), "usage": ref("AnthropicUsage"),
}, "A message; streamed, the same content as typed events", required=("id", "type", "role", "model", "content",
                                                                        "stop_reason", "usage"))
COUNT_TOKENS_REQUEST = obj({
    "model": string(), "messages": array(ref("AnthropicMessage"), minItems=1), "system": SYSTEM,
    "tools": array(ref("AnthropicTool")), "tool_choice": TOOL_CHOICE, "thinking": THINKING,
}, "POST /v1/messages/count_tokens", required=("model", "messages"))
COUNT_TOKENS_RESPONSE = obj({"input_tokens": integer()}, required=("input_tokens",))
ERROR = obj({"type": string(enum=("error",)), "error": obj({
    "type": string("invalid_request_error, not_found_error, overloaded_error, api_error, ..."),
    "message": string()}, required=("type", "message"))}, "Anthropic's error body", required=("type", "error"))

SCHEMAS: dict[str, Schema] = {
    "AnthropicContentBlock": CONTENT_BLOCK, "AnthropicMessage": MESSAGE, "AnthropicTool": TOOL,
    "AnthropicMessagesRequest": MESSAGES_REQUEST, "AnthropicUsage": USAGE,
    "AnthropicMessagesResponse": MESSAGES_RESPONSE,
    "AnthropicCountTokensRequest": COUNT_TOKENS_REQUEST,
    "AnthropicCountTokensResponse": COUNT_TOKENS_RESPONSE, "AnthropicError": ERROR,
}
