from google.rpc import status_pb2 as _status_pb2
from meshfront.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateStreamRequest(_message.Message):
    __slots__ = ("start", "cancel")
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    start: GenerateStreamStart
    cancel: GenerateStreamCancel
    def __init__(self, start: _Optional[_Union[GenerateStreamStart, _Mapping]] = ..., cancel: _Optional[_Union[GenerateStreamCancel, _Mapping]] = ...) -> None: ...

class GenerateStreamStart(_message.Message):
    __slots__ = ("id", "request")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: GenerateRequest
    def __init__(self, id: _Optional[int] = ..., request: _Optional[_Union[GenerateRequest, _Mapping]] = ...) -> None: ...

class GenerateStreamCancel(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[GenerateStreamChunk]
    def __init__(self, chunks: _Optional[_Iterable[_Union[GenerateStreamChunk, _Mapping]]] = ...) -> None: ...

class GenerateStreamChunk(_message.Message):
    __slots__ = ("id", "response", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    response: GenerateResponse
    error: _status_pb2.Status
    def __init__(self, id: _Optional[int] = ..., response: _Optional[_Union[GenerateResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request", "options", "worker_address", "worker_id", "resume", "prefill_worker_address", "prefill_worker_id", "prefill_dp_rank")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    request: _common_pb2.PreprocessedRequest
    options: _common_pb2.PostprocessOptions
    worker_address: str
    worker_id: str
    resume: Resume
    prefill_worker_address: str
    prefill_worker_id: str
    prefill_dp_rank: int
    def __init__(self, request: _Optional[_Union[_common_pb2.PreprocessedRequest, _Mapping]] = ..., options: _Optional[_Union[_common_pb2.PostprocessOptions, _Mapping]] = ..., worker_address: _Optional[str] = ..., worker_id: _Optional[str] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., prefill_worker_address: _Optional[str] = ..., prefill_worker_id: _Optional[str] = ..., prefill_dp_rank: _Optional[int] = ...) -> None: ...

class Resume(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "completion_tokens", "logprobs", "finish_reason", "stop_reason", "cached_tokens", "prompt_tokens", "reasoning_text", "tool_calls", "worker_id", "token_ids", "prefill_worker_id", "kv_transfer_ms")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_MS_FIELD_NUMBER: _ClassVar[int]
    text: str
    completion_tokens: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenText]
    finish_reason: _common_pb2.FinishReason
    stop_reason: str
    cached_tokens: int
    prompt_tokens: int
    reasoning_text: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    worker_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    prefill_worker_id: str
    kv_transfer_ms: float
    def __init__(self, text: _Optional[str] = ..., completion_tokens: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenText, _Mapping]]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., stop_reason: _Optional[str] = ..., cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., reasoning_text: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ..., worker_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., prefill_worker_id: _Optional[str] = ..., kv_transfer_ms: _Optional[float] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class TokenText(_message.Message):
    __slots__ = ("token", "logprob", "top")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopTokenText]
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopTokenText, _Mapping]]] = ...) -> None: ...

class TopTokenText(_message.Message):
    __slots__ = ("token", "logprob")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...
