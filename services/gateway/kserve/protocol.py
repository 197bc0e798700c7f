"""The KServe v2 message classes, built from our own proto in a private descriptor pool.

``protos/inference`` declares the same ``inference.*`` names as tritonclient's
generated modules. Generated ``*_pb2.py`` files would register those names in
protobuf's process-wide default pool, and a process that imports both (the
tests, or anyone embedding the gateway next to a Triton client) would fail
with "duplicate symbol". ``tools/codegen.py`` therefore emits only a
FileDescriptorSet, and this module loads it into a pool of its own.
"""

from __future__ import annotations

import importlib.resources

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE = "inference.GRPCInferenceService"


def _load_pool() -> descriptor_pool.DescriptorPool:
    raw = importlib.resources.files("meshfront.kserve").joinpath("inference.binpb").read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(raw).file:  # protoc writes dependencies first
        pool.Add(file)
    return pool


POOL = _load_pool()


def _message(name: str):
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"inference.{name}"))


ServerLiveRequest = _message("ServerLiveRequest")
ServerLiveResponse = _message("ServerLiveResponse")
ServerReadyRequest = _message("ServerReadyRequest")
ServerReadyResponse = _message("ServerReadyResponse")
ModelReadyRequest = _message("ModelReadyRequest")
ModelReadyResponse = _message("ModelReadyResponse")
ServerMetadataRequest = _message("ServerMetadataRequest")
ServerMetadataResponse = _message("ServerMetadataResponse")
ModelMetadataRequest = _message("ModelMetadataRequest")
ModelMetadataResponse = _message("ModelMetadataResponse")
ModelConfigRequest = _message("ModelConfigRequest")
ModelConfigResponse = _message("ModelConfigResponse")
ModelInferRequest = _message("ModelInferRequest")
ModelInferResponse = _message("ModelInferResponse")
ModelStreamInferResponse = _message("ModelStreamInferResponse")
InferParameter = _message("InferParameter")

DATA_TYPE = {v.name: v.number for v in POOL.FindEnumTypeByName("inference.DataType").values}

# rpc name -> (request class, response class, client streaming, server streaming)
METHODS = {
    m.name: (_message(m.input_type.name), _message(m.output_type.name), m.client_streaming, m.server_streaming)
    for m in POOL.FindServiceByName(SERVICE).methods
}
