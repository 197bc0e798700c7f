"""The errors of the key check and the quotas, in the mesh's one table of domain errors (common/errors.py).

A missing or unknown key is 401 (OpenAI's ``invalid_api_key``; Anthropic's ``authentication_error`` by its
status; KServe's UNAUTHENTICATED). A quota passed is 429 (RESOURCE_EXHAUSTED) carrying what the front door
needs for ``retry-after`` and the rate-limit headers. A model outside the key's list is not an error of
its own: it is the 404 of a model that does not exist (``front_door.check_model``'s), so a key learns
nothing about models it may not use.
"""

from __future__ import annotations

import grpc

from services.common.errors import MeshError
from services.gateway.auth.quota import Snapshot


class Unauthenticated(MeshError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401
    openai_type = "invalid_request_error"
    reason = "UNAUTHENTICATED"

    def __init__(self, presented: bool):
        super().__init__("Incorrect API key provided." if presented else
                         "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' "
                         "(or 'x-api-key: <key>' on /v1/messages).", code="invalid_api_key")


class RateLimited(MeshError):
    """``quota`` (the key's limits and what is left) gives the 429's rate-limit headers; ``limit`` is what was
    passed (``requests``, ``tokens`` or ``concurrency``)."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    reason = "RATE_LIMITED"

    def __init__(self, message: str, *, limit: str, retry_after_s: int, quota: Snapshot):
        super().__init__(message, code="rate_limit_exceeded")
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.quota = quota
        # OpenAI's 429 body names what ran out in its type: "requests" or "tokens".
        self.openai_type = "tokens" if limit == "tokens" else "requests"
