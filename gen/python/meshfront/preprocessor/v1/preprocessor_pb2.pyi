from meshfront.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PreprocessRequest(_message.Message):
    __slots__ = ("request", "messages_json", "text", "tokens", "tools_json", "tool_choice", "chat_template_kwargs_json", "return_formatted_prompt", "single_call")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    RETURN_FORMATTED_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SINGLE_CALL_FIELD_NUMBER: _ClassVar[int]
    request: _common_pb2.PreprocessedRequest
    messages_json: str
    text: str
    tokens: TokenIds
    tools_json: str
    tool_choice: _common_pb2.ToolChoice
    chat_template_kwargs_json: str
    return_formatted_prompt: bool
    single_call: bool
    def __init__(self, request: _Optional[_Union[_common_pb2.PreprocessedRequest, _Mapping]] = ..., messages_json: _Optional[str] = ..., text: _Optional[str] = ..., tokens: _Optional[_Union[TokenIds, _Mapping]] = ..., tools_json: _Optional[str] = ..., tool_choice: _Optional[_Union[_common_pb2.ToolChoice, _Mapping]] = ..., chat_template_kwargs_json: _Optional[str] = ..., return_formatted_prompt: _Optional[bool] = ..., single_call: _Optional[bool] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PreprocessResponse(_message.Message):
    __slots__ = ("request", "block_hashes", "postprocess", "formatted_prompt")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    POSTPROCESS_FIELD_NUMBER: _ClassVar[int]
    FORMATTED_PROMPT_FIELD_NUMBER: _ClassVar[int]
    request: _common_pb2.PreprocessedRequest
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    postprocess: _common_pb2.PostprocessOptions
    formatted_prompt: str
    def __init__(self, request: _Optional[_Union[_common_pb2.PreprocessedRequest, _Mapping]] = ..., block_hashes: _Optional[_Iterable[int]] = ..., postprocess: _Optional[_Union[_common_pb2.PostprocessOptions, _Mapping]] = ..., formatted_prompt: _Optional[str] = ...) -> None: ...

class PreprocessEmbeddingsRequest(_message.Message):
    __slots__ = ("request_id", "model", "inputs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    inputs: _containers.RepeatedCompositeFieldContainer[EmbeddingInput]
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[EmbeddingInput, _Mapping]]] = ...) -> None: ...

class EmbeddingInput(_message.Message):
    __slots__ = ("text", "tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    tokens: TokenIds
    def __init__(self, text: _Optional[str] = ..., tokens: _Optional[_Union[TokenIds, _Mapping]] = ...) -> None: ...

class PreprocessEmbeddingsResponse(_message.Message):
    __slots__ = ("inputs",)
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[TokenIds]
    def __init__(self, inputs: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ...) -> None: ...
