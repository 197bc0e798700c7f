from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MediaKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEDIA_KIND_UNSPECIFIED: _ClassVar[MediaKind]
    MEDIA_KIND_IMAGE: _ClassVar[MediaKind]
    MEDIA_KIND_VIDEO: _ClassVar[MediaKind]
MEDIA_KIND_UNSPECIFIED: MediaKind
MEDIA_KIND_IMAGE: MediaKind
MEDIA_KIND_VIDEO: MediaKind

class GenerateMediaRequest(_message.Message):
    __slots__ = ("request_id", "model", "kind", "prompt", "negative_prompt", "width", "height", "n", "num_inference_steps", "guidance_scale", "seed", "input_image", "mask", "output_format", "output_compression", "partial_images", "num_frames", "fps", "background", "quality")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    NUM_INFERENCE_STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    INPUT_IMAGE_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_IMAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    kind: MediaKind
    prompt: str
    negative_prompt: str
    width: int
    height: int
    n: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    input_image: bytes
    mask: bytes
    output_format: str
    output_compression: int
    partial_images: int
    num_frames: int
    fps: float
    background: str
    quality: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., kind: _Optional[_Union[MediaKind, str]] = ..., prompt: _Optional[str] = ..., negative_prompt: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., n: _Optional[int] = ..., num_inference_steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., seed: _Optional[int] = ..., input_image: _Optional[bytes] = ..., mask: _Optional[bytes] = ..., output_format: _Optional[str] = ..., output_compression: _Optional[int] = ..., partial_images: _Optional[int] = ..., num_frames: _Optional[int] = ..., fps: _Optional[float] = ..., background: _Optional[str] = ..., quality: _Optional[str] = ...) -> None: ...

class GenerateMediaResponse(_message.Message):
    __slots__ = ("progress", "partial", "chunk", "done")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    progress: MediaProgress
    partial: MediaPartial
    chunk: MediaChunk
    done: MediaDone
    def __init__(self, progress: _Optional[_Union[MediaProgress, _Mapping]] = ..., partial: _Optional[_Union[MediaPartial, _Mapping]] = ..., chunk: _Optional[_Union[MediaChunk, _Mapping]] = ..., done: _Optional[_Union[MediaDone, _Mapping]] = ...) -> None: ...

class MediaProgress(_message.Message):
    __slots__ = ("step", "total_steps")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ...) -> None: ...

class MediaPartial(_message.Message):
    __slots__ = ("index", "partial_index", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    partial_index: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., partial_index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class MediaChunk(_message.Message):
    __slots__ = ("index", "data", "last")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    last: bool
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ...) -> None: ...

class MediaDone(_message.Message):
    __slots__ = ("inference_time_s", "content_type", "num_frames", "fps", "input_tokens", "output_tokens")
    INFERENCE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    inference_time_s: float
    content_type: str
    num_frames: int
    fps: float
    input_tokens: int
    output_tokens: int
    def __init__(self, inference_time_s: _Optional[float] = ..., content_type: _Optional[str] = ..., num_frames: _Optional[int] = ..., fps: _Optional[float] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...
