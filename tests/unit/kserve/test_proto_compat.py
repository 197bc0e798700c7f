"""protos/inference stays wire-compatible with tritonclient's generated KServe v2 / Triton messages."""

from __future__ import annotations

import pytest

from services.gateway.kserve import protocol
from tests.conftest import require_module

pytestmark = pytest.mark.unit

require_module("tritonclient")
from tritonclient.grpc import model_config_pb2, service_pb2  # noqa: E402

THEIRS = {**{m.full_name: m for m in service_pb2.DESCRIPTOR.message_types_by_name.values()},
          **{m.full_name: m for m in model_config_pb2.DESCRIPTOR.message_types_by_name.values()}}


def _ours():
    out = []

    def walk(m):
        out.append(m)
        for n in m.nested_types:
            walk(n)

    for name in ("inference/grpc_service.proto", "inference/model_config.proto"):
        for m in protocol.POOL.FindFileByName(name).message_types_by_name.values():
            walk(m)
    return out


def _theirs(full_name: str):
    top, *nested = full_name.removeprefix("inference.").split(".")
    m = THEIRS[f"inference.{top}"]
    for part in nested:
        m = m.nested_types_by_name[part]
    return m


@pytest.mark.parametrize("ours", _ours(), ids=lambda m: m.full_name)
def test_every_field_matches_tritonclient(ours):
    theirs = _theirs(ours.full_name)
    assert ours.GetOptions().map_entry == theirs.GetOptions().map_entry
    for f in ours.fields:
        t = theirs.fields_by_number.get(f.number)
        assert t is not None, f"{ours.full_name}.{f.name} = {f.number} is not in tritonclient"
        assert (f.name, f.type, f.is_repeated) == (t.name, t.type, t.is_repeated), f.full_name
        if f.message_type is not None:
            assert f.message_type.full_name == t.message_type.full_name
        if f.enum_type is not None:
            assert f.enum_type.full_name == t.enum_type.full_name
        assert (f.containing_oneof and f.containing_oneof.name) == (t.containing_oneof and t.containing_oneof.name)


def test_kserve_messages_are_complete_and_only_model_config_is_a_subset():
    """Every KServe message we serve declares all of Triton's fields; ModelConfig may leave out what we never set."""
    for m in _ours():
        theirs = _theirs(m.full_name)
        if m.file.name.endswith("model_config.proto"):
            continue
        assert set(m.fields_by_number) == set(theirs.fields_by_number), m.full_name


def test_service_methods_and_data_types_match():
    ours = protocol.POOL.FindServiceByName(protocol.SERVICE)
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for m in ours.methods:
        t = theirs.methods_by_name[m.name]
        assert (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming) == (
            t.input_type.full_name, t.output_type.full_name, t.client_streaming, t.server_streaming)
    assert {v.name: v.number for v in model_config_pb2.DataType.DESCRIPTOR.values} == protocol.DATA_TYPE


def test_bytes_round_trip_between_our_classes_and_tritonclients():
    req = service_pb2.ModelInferRequest(model_name="m", id="x")
    req.parameters["max_tokens"].int64_param = 5
    req.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hi")
    ours = protocol.ModelInferRequest.FromString(req.SerializeToString())
    assert ours.parameters["max_tokens"].int64_param == 5 and ours.inputs[0].contents.bytes_contents == [b"hi"]
    assert service_pb2.ModelInferRequest.FromString(ours.SerializeToString()) == req
