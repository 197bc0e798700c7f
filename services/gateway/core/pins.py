"""The worker pins a request may carry, read the same way by every generation front end.

Dynamo's routing pins (dynamo-frontend.md §1.1, ``apply_header_routing_overrides``):

- ``x-worker-instance-id`` sets ``backend_instance_id`` **and** ``decode_worker_id``;
- ``x-prefill-instance-id`` sets ``prefill_worker_id``;
- a header wins over the body's ``nvext`` field.

Chat, completions and KServe (whose parsers are the OpenAI ones) read the body's ``nvext`` too;
``/v1/messages`` and ``/v1/responses`` have no ``nvext`` in their bodies, so their pins are the headers.
Whether a pinned worker exists and has the right role is the router's check (a 400 naming the field,
services/router/disagg.py ``check_pins``); here only the id's form is checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from services.common.errors import InvalidRequest
from services.gateway.core.fields import UINT64, Fields, check_int

WORKER_PIN_HEADER = "x-worker-instance-id"
PREFILL_PIN_HEADER = "x-prefill-instance-id"
# Worker ids are uint64s (Dynamo's form) or short names; anything longer is not an id.
MAX_PIN_CHARS = 128


@dataclasses.dataclass(frozen=True)
class Pins:
    """``worker_id``: the one worker of an aggregated request (``backend_instance_id``); with a prefill pin,
    the decode worker. ``prefill_worker_id`` / ``decode_worker_id``: a disaggregated request's two workers."""

    worker_id: str = ""
    prefill_worker_id: str = ""
    decode_worker_id: str = ""


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


def read_pins(headers: Mapping[str, str], ext: Fields | None = None) -> Pins:
    """The request's pins: the headers, over ``ext`` (the body's ``nvext``; None where the API has none)."""
    worker = headers.get(WORKER_PIN_HEADER)
    prefill = headers.get(PREFILL_PIN_HEADER)
    if worker:
        worker = check_pin_text(worker, "nvext.backend_instance_id")
    if prefill:
        prefill = check_pin_text(prefill, "nvext.prefill_worker_id")
    if ext is None:
        return Pins(worker or "", prefill or "", worker or "")
    # Every body pin is read (and its type checked) even where a header overrides it.
    body = Pins(body_pin(ext, "backend_instance_id"), body_pin(ext, "prefill_worker_id"),
                body_pin(ext, "decode_worker_id"))
    return Pins(worker or body.worker_id, prefill or body.prefill_worker_id, worker or body.decode_worker_id)
