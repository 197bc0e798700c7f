"""Which policy class and tenant a request waits as in the router's queue (services/router/core/wait_queue.py).

The class a request asks for (``RouteRequest.policy_class``):

- with ``--auth``, its key's: ``meshfront keys create --policy-class a,b`` lets the key's requests run in
  ``a`` or ``b``, ``a`` (the first) when they name none. The ``x-dynamo-meta-policy-class`` header (Dynamo's)
  picks among them; a class the key does not list is a 403 (``policy_class_not_allowed``), so a tenant cannot
  buy itself a better class with a header. A key created without ``--policy-class`` runs in the router's
  default class and may pick none;
- without ``--auth``, the header picks any class: nobody is told apart, so nothing is withheld;
- a Batch API line: the router's lowest class (``batch``), whatever its key's.

The tenant (``RouteRequest.tenant``) is the key's: within a class the router serves tenants in turn. Without
``--auth`` every caller is one tenant (""), served in arrival order. A name the router does not declare gets
its default class (as Dynamo maps an unknown policy to its default family): the gateway does not know the
router's classes, and a key may outlive a class.

The front door places each request once, at admission (``place``); the pipelines read the placement when they
ask the router for a worker (``stamp``). It is a context variable: each request runs in a task of its
own, and tasks the request starts later inherit it.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Mapping

import grpc
from meshfront.router.v1 import router_pb2

from services.common.errors import InvalidRequest, MeshError
from services.gateway import auth
from services.gateway.auth.keys import KeyRecord, class_error

HEADER = "x-dynamo-meta-policy-class"


class PolicyClassNotAllowed(MeshError):
    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403
    openai_type = "invalid_request_error"
    reason = "PERMISSION_DENIED"


@dataclasses.dataclass(frozen=True)
class Placement:
    policy_class: str = ""
    tenant: str = ""
    batch: bool = False


UNPLACED = Placement()  # frozen: the default class, one anonymous tenant
_PLACEMENT: contextvars.ContextVar[Placement] = contextvars.ContextVar("placement", default=UNPLACED)


def placement(call_headers: Mapping[str, str], record: KeyRecord | None) -> Placement:
    """The class and tenant of a call presenting ``call_headers``, admitted with key ``record`` (None: --auth
    off). Raises InvalidRequest for a header that is no class name, PolicyClassNotAllowed for one the key
    does not list."""
    asked = call_headers.get(HEADER, "").strip()
    if asked and ("," in asked or class_error(asked)):
        raise InvalidRequest(f"The {HEADER} header {asked[:80]!r} is not a class name: 1 to 64 letters, digits, "
                             "'_', '.' and '-'.", param=HEADER, code="invalid_policy_class")
    if record is None:
        return Placement(asked)
    allowed = record.policy_classes
    if not asked or asked in allowed:
        return Placement(asked or (allowed[0] if allowed else ""), record.tenant)
    listed = f"only {', '.join(allowed)}" if allowed else "none (it runs in the default class)"
    raise PolicyClassNotAllowed(f"This API key may not run in policy class {asked!r}: it allows {listed}.",
                                param=HEADER, code="policy_class_not_allowed")


def place(record: KeyRecord | None, call_headers: Mapping[str, str]) -> None:
    """Places the current request (the front door, at admission); a batch line keeps its batch placement."""
    if not auth.BATCH_LINE.get():
        _PLACEMENT.set(placement(call_headers, record))


def batch_line(tenant: str) -> None:
    """Places the current batch line (services/gateway/batch/inprocess.py): its tenant's, in the lowest class."""
    _PLACEMENT.set(Placement("", tenant, batch=True))


def stamp(request: router_pb2.RouteRequest) -> router_pb2.RouteRequest:
    """``request`` with the current request's placement: ``policy_class``, ``tenant``, ``batch``."""
    p = _PLACEMENT.get()
    request.policy_class, request.tenant, request.batch = p.policy_class, p.tenant, p.batch
    return request
