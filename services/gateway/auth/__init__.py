"""API keys, quotas and per-tenant usage at the gateway (``--auth``; docs/architecture.md, "Keys and quotas").

The check runs in the gateway's front door (services/gateway/front_door.py), the one place every front end's
requests pass (OpenAI, Anthropic, Responses, embeddings, images, videos, KServe over Envoy): Envoy passes the
headers on untouched. Modules: ``keys`` (secrets, hashes, records), ``quota`` (windows and verdicts),
``store`` (the NATS buckets), ``usage`` (totals and /metrics), ``gate`` (the check itself), ``admission`` (what
the front door asks of it, per request), ``errors``.

The front door's side (``admission``): ``admit`` checks a call's key and gives the request its ``Admission``
(quotas, headers, token charges, the models it may see); ``install`` makes the process's gate (the gateway's
assembly, with ``--auth``), and ``installed()`` is None with it off, when every call passes.

For the Batch API (services/gateway/batch/), whose lines run long after the call that created the batch,
perhaps on another replica:

- ``await batch_caller(headers)`` at ``POST /v1/batches`` (and the file routes): the caller's ``KeyRecord``
  (``.key_id``, ``.tenant``, ``.policy_class``), or None when ``--auth`` is off; raises ``Unauthenticated``
  (401 in the caller's shape). Keep ``key_id`` and ``tenant`` in the batch's record: a tenant sees its own.
- ``batch_line(key_id, model)`` before each line runs: the key's current record (None when ``--auth`` is off);
  raises ``Unauthenticated`` once the key is revoked and ``NotFound`` (the unknown model's 404) for a model
  outside its ``--models``: write the line to the error file with that error.
- ``batch_usage(tenant, prompt_tokens, completion_tokens)`` after each line: the tenant's usage (/metrics,
  ``meshfront keys usage``). Batch lines do not count against rpm, tpm or concurrency, which are for
  interactive traffic (OpenAI keeps batch limits apart too).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.common.errors import NotFound
from services.gateway.auth.admission import (
    BATCH_LINE,
    NO_KEY,
    OPEN_ENDPOINTS,
    Admission,
    admit,
    error_headers,
    install,
    installed,
)
from services.gateway.auth.errors import RateLimited, Unauthenticated
from services.gateway.auth.gate import ANTHROPIC_API, GRPC_API, OPENAI_API, Api, Gate, Ticket
from services.gateway.auth.keys import KeyRecord

__all__ = ["ANTHROPIC_API", "BATCH_LINE", "GRPC_API", "NO_KEY", "OPENAI_API", "OPEN_ENDPOINTS", "Admission", "Api",
           "Gate", "KeyRecord", "RateLimited", "Ticket", "Unauthenticated", "admit", "batch_caller", "batch_line",
           "batch_usage", "error_headers", "install", "installed"]


async def batch_caller(call_headers: Mapping[str, str]) -> KeyRecord | None:
    gate = installed()
    return None if gate is None else await gate.lookup(call_headers, OPENAI_API)


def batch_line(key_id: str, model: str) -> KeyRecord | None:
    gate = installed()
    if gate is None:
        return None
    record = gate.by_key_id(key_id)
    if record is None:
        raise Unauthenticated(presented=True)
    if not record.allows(model):
        gate.usage.rejected(record.tenant, "model")
        raise NotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")
    gate.usage.admitted(record.tenant)
    return record


def batch_usage(tenant: str, prompt_tokens: int, completion_tokens: int) -> None:
    gate = installed()
    if gate is not None:
        gate.usage.used(tenant, prompt_tokens, completion_tokens)
