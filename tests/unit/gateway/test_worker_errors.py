"""What a client hears when a worker the gateway calls itself (embedding, media) fails."""

from __future__ import annotations

import grpc
import pytest

from services.common.errors import WorkerFailed
from services.gateway.core.worker_errors import worker_error

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.UNKNOWN])
def test_a_dead_worker_is_worker_failed_with_no_grpc_name_or_address(code):
    e = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="connect to 10.0.0.7:9300 refused")
    err = worker_error(e, "10.0.0.7:9300", "media")
    assert isinstance(err, WorkerFailed)
    assert "media worker" in str(err)
    assert code.name not in str(err) and "10.0.0.7" not in str(err)
