from google.api import annotations_pb2 as _annotations_pb2
from google.api import httpbody_pb2 as _httpbody_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class MetricsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenApiRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DocsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DocsAssetRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...
