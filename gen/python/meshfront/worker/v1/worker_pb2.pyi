from google.rpc import status_pb2 as _status_pb2
from meshfront.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadLoraAdapterRequest(_message.Message):
    __slots__ = ("adapter",)
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    adapter: _common_pb2.LoraAdapter
    def __init__(self, adapter: _Optional[_Union[_common_pb2.LoraAdapter, _Mapping]] = ...) -> None: ...

class LoadLoraAdapterResponse(_message.Message):
    __slots__ = ("loaded",)
    LOADED_FIELD_NUMBER: _ClassVar[int]
    loaded: bool
    def __init__(self, loaded: _Optional[bool] = ...) -> None: ...

class UnloadLoraAdapterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnloadLoraAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: _common_pb2.PreprocessedRequest
    def __init__(self, request: _Optional[_Union[_common_pb2.PreprocessedRequest, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token_ids", "logprobs", "finish_reason", "cached_tokens", "prompt_tokens", "kv_transfer_params")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    finish_reason: _common_pb2.FinishReason
    cached_tokens: int
    prompt_tokens: int
    kv_transfer_params: bytes
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., kv_transfer_params: _Optional[bytes] = ...) -> None: ...

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

class EmbedRequest(_message.Message):
    __slots__ = ("request_id", "model", "inputs", "dimensions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    inputs: _containers.RepeatedCompositeFieldContainer[EmbedInput]
    dimensions: int
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[EmbedInput, _Mapping]]] = ..., dimensions: _Optional[int] = ...) -> None: ...

class EmbedInput(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "dimensions", "prompt_tokens")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedScalarFieldContainer[bytes]
    dimensions: int
    prompt_tokens: int
    def __init__(self, embeddings: _Optional[_Iterable[bytes]] = ..., dimensions: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...
