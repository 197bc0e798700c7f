"""ServerMetadata, ModelMetadata and ModelConfig replies for text and media models (pure: no grpc)."""

from __future__ import annotations

from importlib import metadata as pkg_metadata

from services.gateway.kserve import media, protocol
from services.gateway.kserve.render import CHAT_OUTPUTS, MODEL_VERSION

SERVER_NAME = "meshfront"
PLATFORM = "meshfront"
# name -> (KServe datatype, shape); every input is optional, see requests.py for the combinations.
INPUTS = {
    "text_input": ("BYTES", [1]),
    "messages": ("BYTES", [1]),
    "tools": ("BYTES", [1]),
    "input_ids": ("INT64", [-1]),
    "stream": ("BOOL", [1]),
}
# Chat requests get all four (completions: text_output and finish_reason); see render.py.
OUTPUTS = {name: ("BYTES", [-1]) for name in CHAT_OUTPUTS}
_CONFIG_TYPE = {"BYTES": "TYPE_STRING", "INT64": "TYPE_INT64", "BOOL": "TYPE_BOOL"}


def server_version() -> str:
    try:
        return pkg_metadata.version("meshfront")
    except pkg_metadata.PackageNotFoundError:
        return "0"


def server_metadata():
    return protocol.ServerMetadataResponse(name=SERVER_NAME, version=server_version(), extensions=[])


def model_metadata(name: str, is_media: bool = False):
    resp = protocol.ModelMetadataResponse(name=name, versions=[MODEL_VERSION], platform=PLATFORM)
    inputs, outputs = (media.INPUTS, media.OUTPUTS) if is_media else (INPUTS, OUTPUTS)
    for target, tensors in ((resp.inputs, inputs), (resp.outputs, outputs)):
        for tensor_name, (datatype, shape) in tensors.items():
            target.add(name=tensor_name, datatype=datatype, shape=shape)
    return resp


def model_config(name: str, is_media: bool = False):
    """Text models: decoupled (several responses per request through ModelStreamInfer), no batch dimension.
    Media models: one response per request (the encoded outputs), only ``prompt`` required."""
    resp = protocol.ModelConfigResponse()
    cfg = resp.config
    cfg.name, cfg.platform, cfg.backend, cfg.max_batch_size = name, PLATFORM, PLATFORM, 0
    cfg.model_transaction_policy.decoupled = not is_media
    inputs, outputs = (media.INPUTS, media.OUTPUTS) if is_media else (INPUTS, OUTPUTS)
    for tensor_name, (datatype, shape) in inputs.items():
        cfg.input.add(name=tensor_name, data_type=protocol.DATA_TYPE[_CONFIG_TYPE[datatype]], dims=shape,
                      optional=not (is_media and tensor_name == "prompt"))
    for tensor_name, (datatype, shape) in outputs.items():
        cfg.output.add(name=tensor_name, data_type=protocol.DATA_TYPE[_CONFIG_TYPE[datatype]], dims=shape)
    return resp


def version_known(version: str) -> bool:
    return version in ("", MODEL_VERSION)
