from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullKvRequest(_message.Message):
    __slots__ = ("worker_id", "handle")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    handle: str
    def __init__(self, worker_id: _Optional[str] = ..., handle: _Optional[str] = ...) -> None: ...

class PullKvResponse(_message.Message):
    __slots__ = ("num_tokens", "block_hashes", "waited_s", "computed")
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_FIELD_NUMBER: _ClassVar[int]
    num_tokens: int
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    waited_s: float
    computed: _containers.RepeatedCompositeFieldContainer[ComputedKv]
    def __init__(self, num_tokens: _Optional[int] = ..., block_hashes: _Optional[_Iterable[int]] = ..., waited_s: _Optional[float] = ..., computed: _Optional[_Iterable[_Union[ComputedKv, _Mapping]]] = ...) -> None: ...

class ComputedKv(_message.Message):
    __slots__ = ("start_s", "duration_s", "tokens")
    START_S_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    start_s: float
    duration_s: float
    tokens: int
    def __init__(self, start_s: _Optional[float] = ..., duration_s: _Optional[float] = ..., tokens: _Optional[int] = ...) -> None: ...

class ReleaseKvRequest(_message.Message):
    __slots__ = ("kv_transfer_params",)
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    kv_transfer_params: bytes
    def __init__(self, kv_transfer_params: _Optional[bytes] = ...) -> None: ...

class ReleaseKvResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...
