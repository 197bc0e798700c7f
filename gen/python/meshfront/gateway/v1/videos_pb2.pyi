from google.api import annotations_pb2 as _annotations_pb2
from google.api import httpbody_pb2 as _httpbody_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetVideoRequest(_message.Message):
    __slots__ = ("video_id",)
    VIDEO_ID_FIELD_NUMBER: _ClassVar[int]
    video_id: str
    def __init__(self, video_id: _Optional[str] = ...) -> None: ...

class ListVideosRequest(_message.Message):
    __slots__ = ("after", "limit", "order")
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    after: str
    limit: str
    order: str
    def __init__(self, after: _Optional[str] = ..., limit: _Optional[str] = ..., order: _Optional[str] = ...) -> None: ...

class DeleteVideoRequest(_message.Message):
    __slots__ = ("video_id",)
    VIDEO_ID_FIELD_NUMBER: _ClassVar[int]
    video_id: str
    def __init__(self, video_id: _Optional[str] = ...) -> None: ...

class DownloadVideoContentRequest(_message.Message):
    __slots__ = ("video_id", "variant")
    VIDEO_ID_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    video_id: str
    variant: str
    def __init__(self, video_id: _Optional[str] = ..., variant: _Optional[str] = ...) -> None: ...
