from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteRequest(_message.Message):
    __slots__ = ("request_id", "model", "block_hashes", "prompt_tokens", "worker_id", "exclude_worker_ids", "releases", "first_tokens", "session_id", "session_action", "session_timeout_s", "priority_jump_s", "prefill_worker_id", "decode_worker_id", "explain", "affinity_session_id", "dp_rank", "prefill_dp_rank", "policy_class", "tenant", "batch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ACTION_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_JUMP_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PREFILL_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    POLICY_CLASS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    prompt_tokens: int
    worker_id: str
    exclude_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    releases: _containers.RepeatedCompositeFieldContainer[ReleaseRequest]
    first_tokens: _containers.RepeatedCompositeFieldContainer[FirstTokenReport]
    session_id: str
    session_action: str
    session_timeout_s: int
    priority_jump_s: float
    prefill_worker_id: str
    decode_worker_id: str
    explain: bool
    affinity_session_id: str
    dp_rank: int
    prefill_dp_rank: int
    policy_class: str
    tenant: str
    batch: bool
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., prompt_tokens: _Optional[int] = ..., worker_id: _Optional[str] = ..., exclude_worker_ids: _Optional[_Iterable[str]] = ..., releases: _Optional[_Iterable[_Union[ReleaseRequest, _Mapping]]] = ..., first_tokens: _Optional[_Iterable[_Union[FirstTokenReport, _Mapping]]] = ..., session_id: _Optional[str] = ..., session_action: _Optional[str] = ..., session_timeout_s: _Optional[int] = ..., priority_jump_s: _Optional[float] = ..., prefill_worker_id: _Optional[str] = ..., decode_worker_id: _Optional[str] = ..., explain: _Optional[bool] = ..., affinity_session_id: _Optional[str] = ..., dp_rank: _Optional[int] = ..., prefill_dp_rank: _Optional[int] = ..., policy_class: _Optional[str] = ..., tenant: _Optional[str] = ..., batch: _Optional[bool] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("worker_id", "address", "overlap_blocks", "report_first_token", "reads_first_token_reports", "queue_depth", "prefill_worker_id", "prefill_address", "prefill_overlap_blocks", "disaggregation_reason", "decision", "dp_rank", "prefill_dp_rank")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    READS_FIRST_TOKEN_REPORTS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_OVERLAP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DISAGGREGATION_REASON_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PREFILL_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    overlap_blocks: int
    report_first_token: bool
    reads_first_token_reports: bool
    queue_depth: int
    prefill_worker_id: str
    prefill_address: str
    prefill_overlap_blocks: int
    disaggregation_reason: str
    decision: RoutingDecision
    dp_rank: int
    prefill_dp_rank: int
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., overlap_blocks: _Optional[int] = ..., report_first_token: _Optional[bool] = ..., reads_first_token_reports: _Optional[bool] = ..., queue_depth: _Optional[int] = ..., prefill_worker_id: _Optional[str] = ..., prefill_address: _Optional[str] = ..., prefill_overlap_blocks: _Optional[int] = ..., disaggregation_reason: _Optional[str] = ..., decision: _Optional[_Union[RoutingDecision, _Mapping]] = ..., dp_rank: _Optional[int] = ..., prefill_dp_rank: _Optional[int] = ...) -> None: ...

class RoutingDecision(_message.Message):
    __slots__ = ("policy", "chosen_by", "worker_id", "prefill_worker_id", "candidates", "predicted_cached_tokens", "prompt_tokens")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_BY_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    chosen_by: str
    worker_id: str
    prefill_worker_id: str
    candidates: _containers.RepeatedCompositeFieldContainer[CandidateScore]
    predicted_cached_tokens: int
    prompt_tokens: int
    def __init__(self, policy: _Optional[str] = ..., chosen_by: _Optional[str] = ..., worker_id: _Optional[str] = ..., prefill_worker_id: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[CandidateScore, _Mapping]]] = ..., predicted_cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class CandidateScore(_message.Message):
    __slots__ = ("worker_id", "overlap_blocks", "in_flight", "booked_prompt_tokens", "active_blocks", "score", "eligible", "dp_rank")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    BOOKED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    overlap_blocks: int
    in_flight: int
    booked_prompt_tokens: int
    active_blocks: int
    score: float
    eligible: bool
    dp_rank: int
    def __init__(self, worker_id: _Optional[str] = ..., overlap_blocks: _Optional[int] = ..., in_flight: _Optional[int] = ..., booked_prompt_tokens: _Optional[int] = ..., active_blocks: _Optional[int] = ..., score: _Optional[float] = ..., eligible: _Optional[bool] = ..., dp_rank: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("request_id", "first_token", "cached_tokens", "prompt_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    first_token: bool
    cached_tokens: int
    prompt_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., first_token: _Optional[bool] = ..., cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class FirstTokenReport(_message.Message):
    __slots__ = ("request_id", "cached_tokens", "prompt_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    cached_tokens: int
    prompt_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseBatchRequest(_message.Message):
    __slots__ = ("releases", "first_tokens")
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    releases: _containers.RepeatedCompositeFieldContainer[ReleaseRequest]
    first_tokens: _containers.RepeatedCompositeFieldContainer[FirstTokenReport]
    def __init__(self, releases: _Optional[_Iterable[_Union[ReleaseRequest, _Mapping]]] = ..., first_tokens: _Optional[_Iterable[_Union[FirstTokenReport, _Mapping]]] = ...) -> None: ...

class ReleaseBatchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
