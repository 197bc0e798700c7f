"""What a client hears when the worker generating its tokens fails (the postprocessor's calls)."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import status_pb2

from services.common.errors import WorkerFailed
from services.postprocessor.mux_client import _chunk_error, worker_error

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.UNKNOWN])
def test_a_dead_worker_is_worker_failed_with_no_grpc_name_or_address(code):
    e = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="connect to 10.0.0.7:9500 refused")
    err = worker_error(e, "10.0.0.7:9500")
    assert isinstance(err, WorkerFailed)
    assert code.name not in str(err) and "10.0.0.7" not in str(err)


def test_a_sequence_the_worker_failed_names_no_wire_reason():
    err = _chunk_error(status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message="engine died"),
                       "10.0.0.7:9500")
    assert isinstance(err, WorkerFailed)
    assert "UNAVAILABLE" not in str(err) and "10.0.0.7" not in str(err)
