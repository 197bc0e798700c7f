"""Out-of-range numbers through the whole mesh are 400s in the API's own error shape (issue 12, item 5).

They used to be HTTP 500 ``Unexpected <class 'ValueError'>: Value out of range`` (protobuf refusing the
value when the gateway built a proto), and UNKNOWN on KServe. A token id that fits the mesh's uint32
but not the model's vocabulary is the preprocessor's 400.
"""

from __future__ import annotations

import json

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2

from services.gateway.kserve import protocol
from tests.mesh.conftest import DEMO

pytestmark = pytest.mark.mesh

MSG = [{"role": "user", "content": "Hi"}]
BAD = [
    ("chat max_tokens", "/v1/chat/completions", {"messages": MSG, "max_tokens": 99999999999}, "max_tokens"),
    ("chat top_k", "/v1/chat/completions", {"messages": MSG, "top_k": 1099511627776}, "top_k"),
    ("chat seed beyond uint64", "/v1/chat/completions", {"messages": MSG, "seed": 2**64}, "seed"),
    ("chat min_tokens", "/v1/chat/completions", {"messages": MSG, "min_tokens": 2**32}, "min_tokens"),
    ("chat bool max_tokens", "/v1/chat/completions", {"messages": MSG, "max_tokens": True}, "max_tokens"),
    ("chat float n", "/v1/chat/completions", {"messages": MSG, "n": 1.5}, "n"),
    ("token id beyond uint32", "/v1/completions", {"prompt": [99999999999, 1]}, "prompt"),
    ("negative token id", "/v1/completions", {"prompt": [-1, 1]}, "prompt"),
    ("token id past the vocabulary", "/v1/completions", {"prompt": [10**9, 1]}, "prompt"),
    ("uint32 max token id", "/v1/completions", {"prompt": [[1], [2**32 - 1]]}, "prompt"),
]


@pytest.mark.parametrize("name,path,body,param", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("stream", [False, True])
def test_out_of_range_numbers_are_400_through_envoy(mesh, name, path, body, param, stream):
    r = httpx.post(f"{mesh.url}{path}", content=json.dumps({"model": DEMO, **body, "stream": stream}),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["code"] == 400
    assert "ValueError" not in err["message"] and "Value out of range" not in err["message"]


def _infer(target: str, request) -> grpc.RpcError:
    with grpc.insecure_channel(target) as channel:
        infer = channel.unary_unary(f"/{protocol.SERVICE}/ModelInfer",
                                    request_serializer=protocol.ModelInferRequest.SerializeToString,
                                    response_deserializer=protocol.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as e:
            infer(request, timeout=30)
    return e.value


def _param_of(e: grpc.RpcError) -> str | None:
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info.metadata.get("param")
    return None


def _ids_request(datatype: str, field: str, ids: list[int]):
    req = protocol.ModelInferRequest(model_name=DEMO)
    t = req.inputs.add(name="input_ids", datatype=datatype, shape=[len(ids)])
    getattr(t.contents, field).extend(ids)
    return req


def _param_request(key: str, kind: str, value):
    req = protocol.ModelInferRequest(model_name=DEMO)
    req.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"Hi")
    setattr(req.parameters[key], kind, value)
    return req


KSERVE_BAD = [
    ("input_ids beyond uint32", _ids_request("INT64", "int64_contents", [99999999999, 1]), "input_ids"),
    ("negative input_ids", _ids_request("INT32", "int_contents", [-1, 1]), "input_ids"),
    ("uint64 input_ids", _ids_request("UINT64", "uint64_contents", [2**64 - 1]), "input_ids"),
    ("input_ids past the vocabulary", _ids_request("INT64", "int64_contents", [10**9]), "prompt"),
    ("top_k parameter", _param_request("top_k", "int64_param", 1099511627776), "top_k"),
    ("max_tokens parameter", _param_request("max_tokens", "uint64_param", 2**64 - 1), "max_tokens"),
    ("NaN temperature", _param_request("temperature", "double_param", float("nan")), "temperature"),
    ("fractional min_tokens", _param_request("min_tokens", "double_param", 2.5), "min_tokens"),
]


@pytest.mark.parametrize("name,request_,param", KSERVE_BAD, ids=[b[0] for b in KSERVE_BAD])
@pytest.mark.parametrize("via", ["gateway", "envoy"])
def test_out_of_range_kserve_numbers_are_invalid_argument(mesh, name, request_, param, via):
    target = f"127.0.0.1:{mesh.plan.gateway_ports[0]}" if via == "gateway" else mesh.grpc_target
    e = _infer(target, request_)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
    assert _param_of(e) == param and "ValueError" not in (e.details() or "")
