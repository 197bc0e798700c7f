"""Dynamo's ``nvext`` request object (dynamo-frontend.md §2), read into what this mesh does with it.

Every field Dynamo defines is accepted with its type checked. What applies to a single-stage
(aggregated) deployment is honoured:

- ``greed_sampling``: greedy decoding (temperature 0, no nucleus cut);
- ``annotations``: ``request_id``, ``formatted_prompt`` and ``token_ids`` come back as out-of-band
  SSE events before the first chunk (and under ``nvext`` in a non-streamed body); all are
  forwarded to the worker, as Dynamo does;
- ``backend_instance_id`` pins the worker, and with it ``token_data`` is the prompt (no template);
- ``prefill_worker_id`` (header ``x-prefill-instance-id``) and ``decode_worker_id`` pin the workers of a
  disaggregated request (the router checks their roles: docs/architecture.md, "Disaggregated prefill and decode");
  every front end reads the pins and their headers with core/pins.py;
- ``max_thinking_tokens`` travels to the worker as the request's thinking budget;
- ``extra_fields``: ``worker_id`` and ``timing`` in the response's ``nvext``, and Meshfront's ``routing``:
  the router's decision record (each candidate's overlap, load and score, the choice, the predicted and
  the actual cached tokens; services/common/decision_record.py);
- ``agent_hints.priority`` (or the deprecated ``latency_sensitivity``): seconds the request jumps
  ahead while it waits for a busy model (the router's queue);
- ``session_control``: ``session_id`` is a sticky routing key; ``action: close`` ends the session
  when the request finishes; ``timeout`` is its idle life in seconds.
- the ``X-Dynamo-Session-ID`` header: Dynamo's session key, which the router binds only under its
  ``--router-session-affinity-ttl-secs`` (services/router/core/sessions.py); ``session_control`` wins.
- ``dp_rank`` / ``prefill_dp_rank`` (headers ``x-dp-rank`` / ``x-prefill-dp-rank``): the data-parallel ranks
  of the (decode) worker and of the prefill worker (core/pins.py; the router's check: services/router/dp_pins.py).

What only means something with another engine feature
(``agent_hints.osl``, ``agent_hints.speculative_prefill``, ``request_timestamp_ms``,
``use_raw_prompt``, ``extra_fields: routed_experts``, other annotation names) is accepted and
named in the response header ``x-meshfront-ignored-fields``, never a 400.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Any

from services.common.errors import InvalidRequest
from services.gateway.core.fields import INT32, UINT32, UINT64, Fields, check_float, token_ids
from services.gateway.core.pins import Pins, read_pins

ANNOTATIONS = ("request_id", "formatted_prompt", "token_ids")
EXTRA_FIELDS = ("worker_id", "timing", "routing")
# nvext.stream_interval: Meshfront's own field (SGLang's server option of the same name, per request).
MAX_STREAM_INTERVAL = 1024
IGNORED_EXTRA_FIELDS = ("routed_experts",)
SESSION_ACTIONS = ("open", "close")
# Unknown annotation names are echoed in a response header; these bound its size.
MAX_ANNOTATIONS = 32
MAX_ANNOTATION_CHARS = 256
SESSION_HEADER = "x-dynamo-session-id"
# A session key is remembered by every router replica: a bound on its size bounds theirs.
MAX_SESSION_ID_CHARS = 256


@dataclasses.dataclass
class NvExt:
    """What the mesh does with a request's ``nvext``."""

    greedy: bool = False
    annotations: tuple[str, ...] = ()  # every requested name, forwarded to the worker
    pins: Pins = Pins()  # worker pins, dp_rank, prefill_dp_rank, and their headers (pins.py)
    token_data: list[int] | None = None
    max_thinking_tokens: int | None = None
    extra_fields: tuple[str, ...] = ()  # the honoured ones
    priority_jump_s: float = 0.0
    session_id: str = ""
    session_action: str = ""
    session_timeout_s: int = 0
    affinity_session_id: str = ""  # the X-Dynamo-Session-ID header
    stream_interval: int = 0  # tokens the postprocessor gathers per response; 0: the deployment's default
    ignored: list[str] = dataclasses.field(default_factory=list)  # accepted, named in the response header

    def wants(self, annotation: str) -> bool:
        return annotation in self.annotations


def _strings(ext: Fields, key: str) -> list[str]:
    values = ext.list(key) or []
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise InvalidRequest(f"'nvext.{key}[{i}]' must be a string", param=f"nvext.{key}")
    return values


def _agent_hints(ext: Fields, out: NvExt) -> None:
    hints = ext.obj("agent_hints")
    if hints is None:
        return
    h = Fields(hints, "nvext.agent_hints.")
    priority = h.int("priority", INT32)
    sensitivity = h.raw("latency_sensitivity")
    if sensitivity is not None:
        sensitivity = check_float(sensitivity, "nvext.agent_hints.latency_sensitivity")
    # Dynamo: priority_jump = max(priority, 0) seconds; the deprecated alias when priority is absent.
    jump = priority if priority is not None else sensitivity
    out.priority_jump_s = max(float(jump or 0), 0.0)
    if h.int("osl", UINT32) is not None:
        out.ignored.append("nvext.agent_hints.osl")
    if h.raw("speculative_prefill") is not None:
        h.bool("speculative_prefill")
        out.ignored.append("nvext.agent_hints.speculative_prefill")
    h.reject_unknown()


def _session_control(ext: Fields, out: NvExt) -> None:
    sc = ext.obj("session_control")
    if sc is None:
        return
    s = Fields(sc, "nvext.session_control.")
    out.session_id = s.str("session_id", required=True) or ""
    out.session_action = s.str("action", allowed=SESSION_ACTIONS) or ""
    timeout = s.int("timeout", UINT64, 1)
    out.session_timeout_s = min(timeout, UINT32.hi) if timeout is not None else 0
    s.reject_unknown()


def _session_header(headers: dict[str, str]) -> str:
    value = headers.get(SESSION_HEADER, "").strip()
    if len(value) > MAX_SESSION_ID_CHARS:
        raise InvalidRequest(f"header '{SESSION_HEADER}' holds at most {MAX_SESSION_ID_CHARS} characters",
                             param=SESSION_HEADER)
    return value


def parse_nvext(raw: dict[str, Any] | None, headers: dict[str, str]) -> NvExt:
    """Reads ``nvext`` (None: absent) and Dynamo's routing headers; raises a 400 naming a bad field."""
    out = NvExt()
    ext = Fields(raw or {}, "nvext.")
    out.greedy = ext.bool("greed_sampling")
    if ext.raw("use_raw_prompt") is not None:
        ext.bool("use_raw_prompt")
        out.ignored.append("nvext.use_raw_prompt")
    annotations = _strings(ext, "annotations")
    if len(annotations) > MAX_ANNOTATIONS or any(len(a) > MAX_ANNOTATION_CHARS for a in annotations):
        raise InvalidRequest(f"'nvext.annotations' holds at most {MAX_ANNOTATIONS} names of at most "
                             f"{MAX_ANNOTATION_CHARS} characters", param="nvext.annotations")
    out.annotations = tuple(dict.fromkeys(annotations))
    # Named in a response header: percent-encoded, so any string the client chose is a valid header value.
    out.ignored += [f"nvext.annotations[{urllib.parse.quote(a, safe=':_-.')}]"
                    for a in out.annotations if a not in ANNOTATIONS]
    out.pins = read_pins(headers, ext)
    data = ext.list("token_data")
    if data is not None:
        if not out.pins.worker_id:
            raise InvalidRequest("'nvext.token_data' needs 'nvext.backend_instance_id' (the worker it was "
                                 "tokenized for)", param="nvext.token_data")
        out.token_data = token_ids(data, "nvext.token_data")
    out.max_thinking_tokens = ext.int("max_thinking_tokens", UINT32)
    out.stream_interval = ext.int("stream_interval", UINT32, 1, MAX_STREAM_INTERVAL) or 0
    extra = _strings(ext, "extra_fields")
    for name in extra:
        if name not in EXTRA_FIELDS + IGNORED_EXTRA_FIELDS:
            raise InvalidRequest(f"'nvext.extra_fields' entries must be one of "
                                 f"{', '.join(EXTRA_FIELDS + IGNORED_EXTRA_FIELDS)}; got {name!r}",
                                 param="nvext.extra_fields")
    out.extra_fields = tuple(n for n in dict.fromkeys(extra) if n in EXTRA_FIELDS)
    out.ignored += [f"nvext.extra_fields[{n}]" for n in dict.fromkeys(extra) if n in IGNORED_EXTRA_FIELDS]
    if ext.raw("request_timestamp_ms") is not None:
        check_float(ext.raw("request_timestamp_ms"), "nvext.request_timestamp_ms", 0.0)
        out.ignored.append("nvext.request_timestamp_ms")
    _agent_hints(ext, out)
    _session_control(ext, out)
    out.affinity_session_id = _session_header(headers)
    ext.reject_unknown()
    return out
