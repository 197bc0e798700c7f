"""The worker pins a request may carry, read the same way by every generation front end.

Dynamo's routing pins (dynamo-frontend.md §1.1, ``apply_header_routing_overrides``):

- ``x-worker-instance-id`` sets ``backend_instance_id`` **and** ``decode_worker_id``;
- ``x-prefill-instance-id`` sets ``prefill_worker_id``;
- ``x-dp-rank`` sets ``dp_rank`` and ``x-prefill-dp-rank`` ``prefill_dp_rank``, the data-parallel ranks of the
  (decode) worker and of the prefill worker (services/router/dp_pins.py); Dynamo's ``4294967295`` is no rank;
- a header wins over the body's ``nvext`` field.

Chat, completions and KServe (whose parsers are the OpenAI ones) read the body's ``nvext`` too;
``/v1/messages`` and ``/v1/responses`` have no ``nvext`` in their bodies, so their pins are the headers.
Whether a pinned worker exists and has the right role is the router's check (a 400 naming the field,
services/router/disagg.py ``check_pins``); here only the id's form is checked.

An error about a pin names what the client sent: the header when the pin came from one, the body field
otherwise. The router knows only the fields (``RouteRequest`` carries ids, not where they came from), so its
errors name ``'nvext.<field>'`` and the gateway renames them (``Pins.names``, ``named_as_sent``); on the APIs
without ``nvext`` every pin field is named by its header, the advice in an error included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.common.dp_ranks import NO_RANK
from services.common.errors import InvalidRequest
from services.gateway.core.fields import UINT32, UINT64, Fields, check_int

WORKER_PIN_HEADER = "x-worker-instance-id"
PREFILL_PIN_HEADER = "x-prefill-instance-id"
# The body fields (and the router's error params, services/router/disagg.py) and the header that sets each.
WORKER_PIN_FIELD = "nvext.backend_instance_id"
PREFILL_PIN_FIELD = "nvext.prefill_worker_id"
DECODE_PIN_FIELD = "nvext.decode_worker_id"
DP_RANK_HEADER, PREFILL_DP_RANK_HEADER = "x-dp-rank", "x-prefill-dp-rank"
DP_RANK_FIELD, PREFILL_DP_RANK_FIELD = "nvext.dp_rank", "nvext.prefill_dp_rank"
HEADER_OF = {WORKER_PIN_FIELD: WORKER_PIN_HEADER, DECODE_PIN_FIELD: WORKER_PIN_HEADER,
             PREFILL_PIN_FIELD: PREFILL_PIN_HEADER, DP_RANK_FIELD: DP_RANK_HEADER,
             PREFILL_DP_RANK_FIELD: PREFILL_DP_RANK_HEADER}
# Worker ids are uint64s (Dynamo's form) or short names; anything longer is not an id.
MAX_PIN_CHARS = 128


@dataclasses.dataclass(frozen=True)
class Pins:
    """``worker_id``: the one worker of an aggregated request (``backend_instance_id``); with a prefill pin,
    the decode worker. ``prefill_worker_id`` / ``decode_worker_id``: a disaggregated request's two workers."""

    worker_id: str = ""
    prefill_worker_id: str = ""
    decode_worker_id: str = ""
    # (field, header) for each pin field the client set, or can only set, with a header: an error about that
    # field names the header instead.
    names: tuple[tuple[str, str], ...] = ()
    # Data-parallel ranks (nvext.dp_rank / x-dp-rank, nvext.prefill_dp_rank / x-prefill-dp-rank); None: unpinned.
    dp_rank: int | None = None
    prefill_dp_rank: int | None = None


def check_pin_text(pin: str, param: str) -> str:
    """A worker id is a short printable string: one with control characters (only a JSON string can
    carry them) or too long to be an id is refused here, so no error or log line ever echoes it raw."""
    if len(pin) > MAX_PIN_CHARS or not pin.isprintable():
        raise InvalidRequest(f"'{param}' must be a worker id: at most {MAX_PIN_CHARS} printable characters",
                             param=param)
    return pin


def body_pin(ext: Fields, key: str) -> str:
    """A worker id in ``nvext``, as a string or (Dynamo's form) a non-negative integer; "" when absent."""
    v = ext.raw(key)
    if v is None:
        return ""
    if isinstance(v, str):
        return check_pin_text(v, f"nvext.{key}")
    if isinstance(v, int) and not isinstance(v, bool):
        return str(check_int(v, f"nvext.{key}", UINT64))
    raise InvalidRequest(f"'nvext.{key}' must be a string or a non-negative integer", param=f"nvext.{key}")


def header_rank(headers: Mapping[str, str], header: str) -> int | None:
    """A rank header's value: a u32, where Dynamo's 4294967295 (and an empty value) means no rank."""
    raw = headers.get(header, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) > UINT32.hi:
        raise InvalidRequest(f"header '{header}' must be a data-parallel rank (a non-negative 32-bit integer)",
                             param=header)
    return _rank(int(raw))


def _rank(rank: int | None) -> int | None:
    return None if rank == NO_RANK else rank  # Dynamo's "no rank" (u32::MAX), in a header or the body


def read_pins(headers: Mapping[str, str], ext: Fields | None = None) -> Pins:
    """The request's pins: the headers, over ``ext`` (the body's ``nvext``; None where the API has none)."""
    worker = headers.get(WORKER_PIN_HEADER)
    prefill = headers.get(PREFILL_PIN_HEADER)
    if worker:
        worker = check_pin_text(worker, WORKER_PIN_HEADER)
    if prefill:
        prefill = check_pin_text(prefill, PREFILL_PIN_HEADER)
    rank, prefill_rank = header_rank(headers, DP_RANK_HEADER), header_rank(headers, PREFILL_DP_RANK_HEADER)
    if ext is None:
        return Pins(worker or "", prefill or "", worker or "", tuple(HEADER_OF.items()), rank, prefill_rank)
    # Every body pin is read (and its type checked) even where a header overrides it.
    body = Pins(body_pin(ext, "backend_instance_id"), body_pin(ext, "prefill_worker_id"),
                body_pin(ext, "decode_worker_id"), (), _rank(ext.int("dp_rank", UINT32)),
                _rank(ext.int("prefill_dp_rank", UINT32)))
    names: tuple[tuple[str, str], ...] = ()
    if worker:
        names = ((WORKER_PIN_FIELD, WORKER_PIN_HEADER), (DECODE_PIN_FIELD, WORKER_PIN_HEADER))
    if prefill:
        names += ((PREFILL_PIN_FIELD, PREFILL_PIN_HEADER),)
    if rank is not None:
        names += ((DP_RANK_FIELD, DP_RANK_HEADER),)
    if prefill_rank is not None:
        names += ((PREFILL_DP_RANK_FIELD, PREFILL_DP_RANK_HEADER),)
    return Pins(worker or body.worker_id, prefill or body.prefill_worker_id, worker or body.decode_worker_id, names,
                body.dp_rank if rank is None else rank, body.prefill_dp_rank if prefill_rank is None else prefill_rank)


def named_as_sent(error: InvalidRequest, names: Sequence[tuple[str, str]]) -> InvalidRequest:
    """The router's error about a pin, naming the header where the client pinned (or can only pin) with one:
    its ``'nvext.<field>'`` mentions become "the <header> header", and so does its param."""
    renamed = dict(names)
    message = error.message
    for field, header in renamed.items():
        message = message.replace(f"'{field}'", f"the {header} header")
    param = renamed.get(error.param or "", error.param)
    if (message, param) == (error.message, error.param):
        return error
    if message.startswith("the "):  # the header is the message's subject
        message = "The" + message[3:]
    return InvalidRequest(message, param=param, code=error.code)
