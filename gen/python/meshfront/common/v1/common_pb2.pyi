from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALLS: _ClassVar[FinishReason]

class DisaggregationRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISAGGREGATION_ROLE_UNSPECIFIED: _ClassVar[DisaggregationRole]
    DISAGGREGATION_ROLE_PREFILL: _ClassVar[DisaggregationRole]
    DISAGGREGATION_ROLE_DECODE: _ClassVar[DisaggregationRole]

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_MODE_UNSPECIFIED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_AUTO: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NONE: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_REQUIRED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NAMED: _ClassVar[ToolChoiceMode]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_ERROR: FinishReason
FINISH_REASON_TOOL_CALLS: FinishReason
DISAGGREGATION_ROLE_UNSPECIFIED: DisaggregationRole
DISAGGREGATION_ROLE_PREFILL: DisaggregationRole
DISAGGREGATION_ROLE_DECODE: DisaggregationRole
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
TOOL_CHOICE_MODE_NAMED: ToolChoiceMode

class SamplingOptions(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_p", "guided_decoding")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    GUIDED_DECODING_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    frequency_penalty: float
    presence_penalty: float
    repetition_penalty: float
    min_p: float
    guided_decoding: GuidedDecoding
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., min_p: _Optional[float] = ..., guided_decoding: _Optional[_Union[GuidedDecoding, _Mapping]] = ...) -> None: ...

class GuidedDecoding(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "choice", "grammar", "structural_tag")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    STRUCTURAL_TAG_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    choice: _containers.RepeatedScalarFieldContainer[str]
    grammar: str
    structural_tag: str
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., choice: _Optional[_Iterable[str]] = ..., grammar: _Optional[str] = ..., structural_tag: _Optional[str] = ...) -> None: ...

class StopConditions(_message.Message):
    __slots__ = ("max_tokens", "stop", "stop_token_ids_hidden", "min_tokens", "ignore_eos", "include_stop_str_in_output", "max_thinking_tokens")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    MAX_THINKING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids_hidden: _containers.RepeatedScalarFieldContainer[int]
    min_tokens: int
    ignore_eos: bool
    include_stop_str_in_output: bool
    max_thinking_tokens: int
    def __init__(self, max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids_hidden: _Optional[_Iterable[int]] = ..., min_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., include_stop_str_in_output: _Optional[bool] = ..., max_thinking_tokens: _Optional[int] = ...) -> None: ...

class OutputOptions(_message.Message):
    __slots__ = ("logprobs", "skip_special_tokens")
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    logprobs: int
    skip_special_tokens: bool
    def __init__(self, logprobs: _Optional[int] = ..., skip_special_tokens: _Optional[bool] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class PreprocessedRequest(_message.Message):
    __slots__ = ("request_id", "model", "token_ids", "sampling", "stop", "output", "eos_token_ids", "media", "annotations", "disaggregation", "traceparent", "lora", "dp_rank")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    DISAGGREGATION_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingOptions
    stop: StopConditions
    output: OutputOptions
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    media: _containers.RepeatedCompositeFieldContainer[MediaItem]
    annotations: _containers.RepeatedScalarFieldContainer[str]
    disaggregation: DisaggregationParams
    traceparent: str
    lora: LoraAdapter
    dp_rank: int
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingOptions, _Mapping]] = ..., stop: _Optional[_Union[StopConditions, _Mapping]] = ..., output: _Optional[_Union[OutputOptions, _Mapping]] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., media: _Optional[_Iterable[_Union[MediaItem, _Mapping]]] = ..., annotations: _Optional[_Iterable[str]] = ..., disaggregation: _Optional[_Union[DisaggregationParams, _Mapping]] = ..., traceparent: _Optional[str] = ..., lora: _Optional[_Union[LoraAdapter, _Mapping]] = ..., dp_rank: _Optional[int] = ...) -> None: ...

class LoraAdapter(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class DisaggregationParams(_message.Message):
    __slots__ = ("role", "kv_transfer_params", "peer_worker_id", "peer_address")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    PEER_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    role: DisaggregationRole
    kv_transfer_params: bytes
    peer_worker_id: str
    peer_address: str
    def __init__(self, role: _Optional[_Union[DisaggregationRole, str]] = ..., kv_transfer_params: _Optional[bytes] = ..., peer_worker_id: _Optional[str] = ..., peer_address: _Optional[str] = ...) -> None: ...

class MediaItem(_message.Message):
    __slots__ = ("modality", "url", "data", "format", "detail", "message_index", "part_index", "content", "mime_type", "content_hash", "uuid", "token_offset", "token_count", "width", "height")
    MODALITY_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PART_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    modality: str
    url: str
    data: str
    format: str
    detail: str
    message_index: int
    part_index: int
    content: bytes
    mime_type: str
    content_hash: int
    uuid: str
    token_offset: int
    token_count: int
    width: int
    height: int
    def __init__(self, modality: _Optional[str] = ..., url: _Optional[str] = ..., data: _Optional[str] = ..., format: _Optional[str] = ..., detail: _Optional[str] = ..., message_index: _Optional[int] = ..., part_index: _Optional[int] = ..., content: _Optional[bytes] = ..., mime_type: _Optional[str] = ..., content_hash: _Optional[int] = ..., uuid: _Optional[str] = ..., token_offset: _Optional[int] = ..., token_count: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function_name")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    function_name: str
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., function_name: _Optional[str] = ...) -> None: ...

class PostprocessOptions(_message.Message):
    __slots__ = ("model_dir", "tool_call_parser", "reasoning_parser", "prompt_opens_reasoning", "tools_json", "tool_choice", "thinking_disabled", "single_tool_call", "stream_interval", "model_files", "history_tool_calls", "tool_calls_in_model_format")
    MODEL_DIR_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_PARSER_FIELD_NUMBER: _ClassVar[int]
    REASONING_PARSER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_OPENS_REASONING_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    THINKING_DISABLED_FIELD_NUMBER: _ClassVar[int]
    SINGLE_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FILES_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_IN_MODEL_FORMAT_FIELD_NUMBER: _ClassVar[int]
    model_dir: str
    tool_call_parser: str
    reasoning_parser: str
    prompt_opens_reasoning: bool
    tools_json: str
    tool_choice: ToolChoice
    thinking_disabled: bool
    single_tool_call: bool
    stream_interval: int
    model_files: str
    history_tool_calls: int
    tool_calls_in_model_format: bool
    def __init__(self, model_dir: _Optional[str] = ..., tool_call_parser: _Optional[str] = ..., reasoning_parser: _Optional[str] = ..., prompt_opens_reasoning: _Optional[bool] = ..., tools_json: _Optional[str] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., thinking_disabled: _Optional[bool] = ..., single_tool_call: _Optional[bool] = ..., stream_interval: _Optional[int] = ..., model_files: _Optional[str] = ..., history_tool_calls: _Optional[int] = ..., tool_calls_in_model_format: _Optional[bool] = ...) -> None: ...
