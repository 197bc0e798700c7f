"""Schemas of the OpenAI-compatible routes: chat, completions, models, embeddings, responses, errors.

Request schemas list exactly the fields the parsers accept (services/gateway/core/openai_request.py);
tests/unit/gateway/test_openapi.py sends each listed field to the parser and checks that fields the
schema does not list are refused, so the two cannot drift.
"""

from __future__ import annotations

from services.gateway.core.openai_fields import REASONING_EFFORTS, VERBOSITIES
from services.gateway.http_api.schema import Schema, array, boolean, integer, map_of, number, obj, one_of, ref, string

UINT32_MAX = 2**32 - 1

ERROR = obj({"error": obj({
    "message": string("What went wrong, for a person"),
    "type": string("invalid_request_error, not_found_error, service_unavailable, ..."),
    "param": string("The offending request field", nullable=True),
    "code": one_of(string(), integer(), description="A machine-readable code or the HTTP status", nullable=True),
}, required=("message", "type"))}, "OpenAI's error body, for every 4xx and 5xx", required=("error",))

STREAM_OPTIONS = obj({"include_usage": boolean("End the stream with a chunk carrying `usage`")},
                     "Only with `stream: true`")
NVEXT = obj({
    "backend_instance_id": one_of(string(), integer(minimum=0),
                                  description="Pin the request to this worker id (header x-worker-instance-id)"),
    "greed_sampling": boolean("Greedy decoding"),
    "annotations": array(string(), "request_id, formatted_prompt, token_ids: sent before the first chunk"),
    "token_data": array(integer(minimum=0), "The prompt's token ids (needs backend_instance_id)"),
    "max_thinking_tokens": integer("Reasoning budget forwarded to the worker", minimum=0),
    "stream_interval": integer("Tokens gathered into one streamed event (gateway --stream-interval by default)",
                               minimum=1, maximum=1024),
    "extra_fields": array(string(enum=("worker_id", "timing", "routed_experts")),
                          "Response nvext fields to return"),
    "agent_hints": map_of({}, "priority (seconds ahead in a busy model's queue); osl, speculative_prefill ignored"),
    "session_control": map_of({}, "{session_id, action: open|close, timeout}: sticky routing"),
    "prefill_worker_id": one_of(string(), integer(minimum=0), description="Pin the prefill leg to this prefill "
                                "worker (header x-prefill-instance-id): the request is disaggregated"),
    "decode_worker_id": one_of(string(), integer(minimum=0), description="Pin the decode worker"),
    "dp_rank": integer(minimum=0), "prefill_dp_rank": integer(minimum=0),
    "request_timestamp_ms": number(minimum=0), "use_raw_prompt": boolean(),
}, "Dynamo's extension object (docs/openai-extensions.md); data-parallel ranks and engine-only fields are accepted "
   "and named in x-meshfront-ignored-fields")
STRUCTURED_OUTPUTS = obj({
    "json": one_of(map_of({}), string(), description="A JSON schema the output must follow"),
    "regex": string("A regular expression the output must match"),
    "choice": array(string(), "The output is one of these strings"),
    "grammar": string("An EBNF grammar the output must follow"),
    "json_object": boolean("The output is a JSON object"),
}, "vLLM's structured outputs; one constraint per request")


def _sampling(max_tokens_doc: str) -> dict[str, Schema]:
    """Fields both generation endpoints take (requests.py ``_common``)."""
    return {
        "model": string("A served model id (GET /v1/models)"),
        "stream": boolean("Stream server-sent events"),
        "stream_options": STREAM_OPTIONS,
        "n": integer("Choices to generate", minimum=1, maximum=128),
        "temperature": number(minimum=0, maximum=2),
        "top_p": number(minimum=0, maximum=1),
        "top_k": integer("-1 disables; otherwise >= 1", minimum=-1),
        "min_p": number(minimum=0, maximum=1),
        "seed": integer("int64 or uint64"),
        "frequency_penalty": number(minimum=-2, maximum=2),
        "presence_penalty": number(minimum=-2, maximum=2),
        "repetition_penalty": number("In (0, 2]", minimum=0, maximum=2),
        "max_tokens": integer(max_tokens_doc, minimum=1, maximum=UINT32_MAX),
        "min_tokens": integer("Generate at least this many tokens", minimum=0, maximum=UINT32_MAX),
        "ignore_eos": boolean("Keep generating past end-of-sequence"),
        "stop": one_of(string(minLength=1), array(string(minLength=1), maxItems=32),
                       description="Stop strings (not part of the output unless include_stop_str_in_output)"),
        "include_stop_str_in_output": boolean(),
        "skip_special_tokens": boolean(),
        "logit_bias": map_of(number(), "Accepted only when empty: biases are not supported"),
        "user": string("Bookkeeping; does not change generation"),
        "metadata": map_of({}, "Bookkeeping; does not change generation"),
        "store": boolean("Bookkeeping; does not change generation"),
        "service_tier": string("Bookkeeping; does not change generation"),
        "nvext": NVEXT,
        "structured_outputs": STRUCTURED_OUTPUTS,
        "guided_json": one_of(map_of({}), string(), description="Legacy form of structured_outputs.json"),
        "guided_regex": string("Legacy form of structured_outputs.regex"),
        "guided_choice": array(string(), "Legacy form of structured_outputs.choice"),
        "guided_grammar": string("Legacy form of structured_outputs.grammar"),
    }


CONTENT_PART = obj({"type": string(enum=("text",)), "text": string()}, required=("type", "text"))
TOOL_CALL = obj({
    "id": string(), "type": string(enum=("function",)),
    "function": obj({"name": string(), "arguments": string("JSON text")}, required=("name", "arguments")),
}, required=("id", "type", "function"))
CHAT_MESSAGE = obj({
    "role": string(enum=("system", "developer", "user", "assistant", "tool")),
    "content": one_of(string(), array(CONTENT_PART), description="Text or text parts; null for an assistant "
                      "message with tool_calls", nullable=True),
    "name": string(),
    "tool_calls": array(ref("ToolCall")),
    "tool_call_id": string("Required for role tool"),
    "reasoning_content": string("An earlier turn's reasoning"),
}, required=("role",), extra=True)
TOOL = obj({"type": string(enum=("function",)), "function": obj({
    "name": string(maxLength=96), "description": string(), "parameters": map_of({}, "A JSON schema"),
    "strict": boolean(),
}, required=("name",))}, required=("type", "function"))
RESPONSE_FORMAT = obj({
    "type": string(enum=("text", "json_object", "json_schema")),
    "json_schema": obj({"name": string(), "description": string(), "schema": map_of({}), "strict": boolean()},
                       required=("name",)),
}, required=("type",))

CHAT_REQUEST = obj({
    "messages": array(ref("ChatMessage"), minItems=1),
    **_sampling("Deprecated alias of max_completion_tokens"),
    "max_completion_tokens": integer("Upper bound on generated tokens", minimum=1, maximum=UINT32_MAX),
    "logprobs": boolean(),
    "top_logprobs": integer("Needs logprobs: true", minimum=0, maximum=20),
    "tools": array(ref("Tool")),
    "tool_choice": one_of(string(enum=("none", "auto", "required")),
                          obj({"type": string(enum=("function",)), "function": obj({"name": string()},
                                                                                  required=("name",))},
                              required=("type", "function"))),
    "parallel_tool_calls": boolean(),
    "chat_template_kwargs": map_of({}, "Extra variables for the chat template (e.g. enable_thinking)"),
    "chat_template_args": map_of({}, "Alias of chat_template_kwargs"),
    "reasoning_effort": string("none turns thinking off", enum=REASONING_EFFORTS),
    "verbosity": string("Passed to the chat template", enum=VERBOSITIES),
    "response_format": ref("ResponseFormat"),
    "prompt_cache_key": string("A sticky routing key: requests sharing it go to one worker"),
    "prompt_cache_retention": string("Bookkeeping; does not change generation"),
    "safety_identifier": string("Bookkeeping; does not change generation"),
    "modalities": array(string(enum=("text", "audio")), "Only [\"text\"] is served"),
    "audio": map_of({}, "Audio output is not served: a 400"),
    "prediction": map_of({}, "Predicted outputs: accepted and ignored"),
    "web_search_options": map_of({}, "Hosted web search is not served: a 400"),
    "thinking": one_of(boolean(), map_of({}), description="vLLM/SGLang root field: turn thinking on or off"),
    "enable_thinking": boolean("SGLang root field: turn thinking on or off"),
}, "POST /v1/chat/completions (field details: docs/openai-extensions.md)", required=("model", "messages"))

USAGE = obj({
    "prompt_tokens": integer(), "completion_tokens": integer(), "total_tokens": integer(),
    "prompt_tokens_details": obj({"cached_tokens": integer("Prompt tokens served from a worker's KV cache")}),
}, required=("prompt_tokens", "completion_tokens", "total_tokens"))
FINISH = string(enum=("stop", "length", "tool_calls", "content_filter"), nullable=True)
LOGPROB_TOKEN = obj({"token": string(), "logprob": number(), "bytes": array(integer())})
CHAT_LOGPROBS = obj({"content": array(obj({
    **LOGPROB_TOKEN["properties"], "top_logprobs": array(LOGPROB_TOKEN)}))}, nullable=True)
ASSISTANT = obj({"role": string(enum=("assistant",)), "content": string(nullable=True),
                 "reasoning_content": string(), "tool_calls": array(ref("ToolCall"))}, required=("role",))
CHAT_COMPLETION = obj({
    "id": string("chatcmpl-..."), "object": string(enum=("chat.completion",)), "created": integer(),
    "model": string(),
    "choices": array(obj({"index": integer(), "message": ASSISTANT, "logprobs": CHAT_LOGPROBS,
                          "finish_reason": FINISH}, required=("index", "message", "finish_reason"))),
    "usage": ref("Usage"),
}, required=("id", "object", "created", "model", "choices"))
CHAT_CHUNK = obj({
    "id": string(), "object": string(enum=("chat.completion.chunk",)), "created": integer(), "model": string(),
    "choices": array(obj({"index": integer(), "delta": obj({
        "role": string(), "content": string(nullable=True), "reasoning_content": string(),
        "tool_calls": array(obj({"index": integer(), "id": string(), "type": string(),
                                 "function": obj({"name": string(), "arguments": string()})}))}),
        "logprobs": CHAT_LOGPROBS, "finish_reason": FINISH})),
    "usage": ref("Usage"),
}, "One `data:` frame of a chat stream; the stream ends with `data: [DONE]`",
    required=("id", "object", "created", "model", "choices"))

COMPLETION_REQUEST = obj({
    "prompt": one_of(string(), array(string()), array(integer()), array(array(integer())),
                     description="Text, texts, token ids, or lists of token ids"),
    **_sampling("Upper bound on generated tokens (default 16)"),
    "logprobs": integer("Alternatives per token", minimum=0, maximum=5),
    "echo": boolean("Prepend the prompt (text prompts only)"),
    "best_of": integer("Only equal to n", minimum=1, maximum=20),
    "suffix": string("Accepted only when empty"),
}, "POST /v1/completions", required=("model", "prompt"))
COMPLETION_LOGPROBS = obj({"tokens": array(string()), "token_logprobs": array(number()),
                           "top_logprobs": array(map_of(number())), "text_offset": array(integer())},
                          nullable=True)
COMPLETION = obj({
    "id": string("cmpl-..."), "object": string(enum=("text_completion",)), "created": integer(), "model": string(),
    "choices": array(obj({"index": integer(), "text": string(), "logprobs": COMPLETION_LOGPROBS,
                          "finish_reason": FINISH}, required=("index", "text", "finish_reason"))),
    "usage": ref("Usage"),
}, "A completion, or (streamed) one `data:` frame of it; a stream ends with `data: [DONE]`",
    required=("id", "object", "created", "model", "choices"))

MODEL = obj({"id": string(), "object": string(enum=("model",)), "created": integer(), "owned_by": string(),
             "context_window": integer("The model's context length, when its workers report one"),
             "parent": string("A LoRA adapter's base model (absent for a base model)"),
             "root": string("A LoRA adapter's base model, as `parent` (absent for a base model)")},
            required=("id", "object", "created", "owned_by"))
LOAD_LORA_REQUEST = obj({
    "lora_name": string("The adapter's name: requests use it as their `model`"),
    "lora_path": string("Its PEFT directory (adapter_config.json, adapter_model.safetensors), as the workers see it"),
    "base_model_name": string("The base model, when several served models have LoRA on"),
}, required=("lora_name", "lora_path"))
UNLOAD_LORA_REQUEST = obj({"lora_name": string("The adapter to unload from every worker holding it")},
                          required=("lora_name",))
MODEL_LIST = obj({"object": string(enum=("list",)), "data": array(ref("Model"))}, required=("object", "data"))
HEALTH = obj({"status": string(enum=("healthy", "unhealthy", "warming", "unavailable")),
              "models": map_of(integer(), "Live workers per model"),
              "warming": array(string(), "Workers still warming up (not ready yet)"),
              "unavailable": array(string(), "Stages unreachable for longer than the gateway waits for one "
                                             "(preprocessor, router, postprocessor)"),
              "message": string()}, required=("status", "models"))
LIVE = obj({"status": string(enum=("live", "shutting_down")), "message": string()}, required=("status",))

EMBEDDING_REQUEST = obj({
    "model": string(),
    "input": one_of(string(), array(string()), array(integer()), array(array(integer())),
                    description="Text, texts, token ids, or lists of token ids"),
    "encoding_format": string(enum=("float", "base64")),
    "dimensions": integer(minimum=1),
    "user": string("Bookkeeping; does not change the result"),
}, "POST /v1/embeddings", required=("model", "input"))
EMBEDDING_LIST = obj({
    "object": string(enum=("list",)), "model": string(),
    "data": array(obj({"object": string(enum=("embedding",)), "index": integer(),
                       "embedding": one_of(array(number()), string("base64 of little-endian float32"))},
                      required=("object", "index", "embedding"))),
    "usage": obj({"prompt_tokens": integer(), "total_tokens": integer()}),
}, required=("object", "model", "data"))

RESPONSE_INPUT_ITEM = obj({
    "type": string(enum=("message", "function_call", "function_call_output")),
    "role": string(enum=("system", "developer", "user", "assistant")),
    "content": one_of(string(), array(map_of({}))),
    "call_id": string(), "name": string(), "arguments": string(), "output": string(),
}, "A message or a tool round trip", extra=True)
RESPONSE_REQUEST = obj({
    "model": string(),
    "input": one_of(string(), array(ref("ResponseInputItem"))),
    "instructions": string("A system message"),
    "stream": boolean("Stream typed server-sent events (response.created, response.output_text.delta, ...)"),
    "max_output_tokens": integer(minimum=1, maximum=UINT32_MAX),
    "temperature": number(minimum=0, maximum=2),
    "top_p": number(minimum=0, maximum=1),
    "tools": array(map_of({}, "A function tool: {type: function, name, parameters}")),
    "tool_choice": one_of(string(enum=("none", "auto", "required")), map_of({})),
    "parallel_tool_calls": boolean(),
    "reasoning": obj({"effort": string(enum=("minimal", "low", "medium", "high")), "summary": string()}),
    "text": obj({"format": map_of({}, "{type: text | json_object | json_schema, ...}")}),
    "previous_response_id": string("Continue from a stored response"),
    "store": boolean("Keep the response for GET /v1/responses/{response_id}"),
    "metadata": map_of(string()),
    "user": string(),
}, "POST /v1/responses", required=("model", "input"))
RESPONSE = obj({
    "id": string("resp_..."), "object": string(enum=("response",)), "created_at": integer(), "model": string(),
    "status": string(enum=("completed", "incomplete", "failed", "in_progress")),
    "output": array(map_of({}, "A message ({type: message, content: [{type: output_text, text}]}), "
                               "reasoning or function_call item")),
    "output_text": string("All output_text parts joined"),
    "usage": obj({"input_tokens": integer(), "output_tokens": integer(), "total_tokens": integer()}),
    "incomplete_details": obj({"reason": string()}, nullable=True),
    "previous_response_id": string(nullable=True),
}, required=("id", "object", "created_at", "model", "status", "output"))
RESPONSE_DELETED = obj({"id": string(), "object": string(enum=("response",)), "deleted": boolean()},
                       required=("id", "object", "deleted"))

SCHEMAS: dict[str, Schema] = {
    "Error": ERROR, "ChatMessage": CHAT_MESSAGE, "ToolCall": TOOL_CALL, "Tool": TOOL,
    "ResponseFormat": RESPONSE_FORMAT, "ChatCompletionRequest": CHAT_REQUEST, "Usage": USAGE,
    "ChatCompletion": CHAT_COMPLETION, "ChatCompletionChunk": CHAT_CHUNK,
    "CompletionRequest": COMPLETION_REQUEST, "Completion": COMPLETION, "Model": MODEL, "ModelList": MODEL_LIST,
    "Health": HEALTH, "Live": LIVE, "EmbeddingRequest": EMBEDDING_REQUEST, "EmbeddingList": EMBEDDING_LIST,
    "ResponseInputItem": RESPONSE_INPUT_ITEM, "ResponseRequest": RESPONSE_REQUEST, "Response": RESPONSE,
    "ResponseDeleted": RESPONSE_DELETED, "LoadLoraAdapterRequest": LOAD_LORA_REQUEST,
    "UnloadLoraAdapterRequest": UNLOAD_LORA_REQUEST,
}
