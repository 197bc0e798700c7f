"""Disaggregated prefill and decode on vLLM: its KV connector's ``kv_transfer_params``, both ways (pure: no
vllm import, so it unit-tests anywhere).

vLLM moves KV blocks between engines with a KV connector, configured by ``--kv-transfer-config`` (vLLM's own
JSON, passed through: ``KVTransferConfig``). A request's connector parameters ride in
``SamplingParams.extra_args["kv_transfer_params"]``, which vLLM's ``Request`` reads into its own
``kv_transfer_params``; when the request finishes, the connector's ``request_finished`` returns what the
other side needs, and vLLM hands it out as the last ``RequestOutput.kv_transfer_params``. The mesh carries
both untouched (``EngineRequest.kv_transfer_params`` in, ``EngineOutput.kv_transfer_params`` out; JSON on the
wire), so whatever connector the operator configured speaks its own protocol:

- **prefill leg** (``{"do_remote_decode": true, ...}``): one output token, as vLLM's own disaggregated proxy
  asks for it (``max_tokens`` 1); the connector keeps the blocks for the decode engine, and its returned
  parameters go out on the last output. NixlConnector's: ``do_remote_prefill``, ``remote_engine_id``,
  ``remote_request_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``, ``tp_size``, ``remote_num_tokens``...
  A connector that shares blocks by content (the shared-storage ``ExampleConnector``, LMCache) returns
  nothing: the leg then returns ``{}``, and the decode engine finds the blocks by the prompt itself.
- **decode leg** (the prefill worker's parameters): passed to vLLM as given (a copy: vLLM's connectors write
  into the dict). A decode leg that vLLM ends with finish reason ``error`` failed to load its blocks
  (``kv_load_failure_policy`` ``fail``, vLLM's default), which the worker reports as ``KvTransferFailed``: the
  caller runs the prefill again instead of blaming this worker.
- **release** (``KvTransferService.ReleaseKv`` on the **decode** worker, with the prefill leg's parameters): a
  client that left between the legs. vLLM 0.32 frees a prefill engine's held blocks only from the decode side:
  ``AsyncLLM.notify_kv_transfer_request_rejected(request_id, kv_transfer_params)`` submits a pre-aborted request
  whose connector tells the prefill engine the parameters name to free them (NixlConnector: a notification,
  no blocks read). So a vLLM worker's card says ``kv_release_by`` decode (services/common/discovery.py), and
  its ``ReleaseKv`` (release_grpc.py) calls that with ``release_params``; parameters that name no remote
  prefill (a content-addressed connector's ``{}``) hold nothing to free.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from services.common.discovery import DECODE, PREFILL
from services.common.errors import InvalidRequest
from services.workers.transfer_legs import Leg, leg

__all__ = ["EXTRA_ARGS_KEY", "Leg", "extra_args", "leg", "release_params", "release_request_id", "returned_params",
           "role_errors"]

# SamplingParams.extra_args key vLLM's Request reads the connector parameters from (vllm/v1/request.py).
EXTRA_ARGS_KEY = "kv_transfer_params"
# What a prefill leg's returned parameters carry when the decode engine must read (or release) remote blocks.
REMOTE_PREFILL_KEY = "do_remote_prefill"


def extra_args(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``SamplingParams.extra_args`` carrying the connector parameters; None for an ordinary request."""
    if not params:
        return None
    return {EXTRA_ARGS_KEY: dict(params)}


def returned_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """A finished prefill leg's ``RequestOutput.kv_transfer_params`` as the decode leg will carry them."""
    return dict(params) if params else {}


def role_errors(disaggregation_mode: str, kv_transfer_config: Any) -> list[str]:
    """What makes ``--disaggregation-mode`` unworkable with vLLM's ``KVTransferConfig`` (or None): a prefill
    worker must produce KV blocks for others, a decode worker consume them."""
    if disaggregation_mode not in (PREFILL, DECODE):
        return []
    example = '\'{"kv_connector": "NixlConnector", "kv_role": "kv_both"}\''
    if kv_transfer_config is None or kv_transfer_config.kv_connector is None:
        return [f"--disaggregation-mode {disaggregation_mode} needs vLLM's --kv-transfer-config (a KV connector "
                f"that moves blocks between engines, e.g. {example})"]
    if disaggregation_mode == PREFILL and not kv_transfer_config.is_kv_producer:
        return [f"--disaggregation-mode prefill needs a kv_role that produces KV (kv_producer or kv_both), "
                f"not {kv_transfer_config.kv_role}"]
    if disaggregation_mode == DECODE and not kv_transfer_config.is_kv_consumer:
        return [f"--disaggregation-mode decode needs a kv_role that consumes KV (kv_consumer or kv_both), "
                f"not {kv_transfer_config.kv_role}"]
    return []


def release_params(raw: bytes) -> dict[str, Any] | None:
    """A ``ReleaseKvRequest``'s parameters as ``notify_kv_transfer_request_rejected`` takes them; None when they
    name no remote prefill (nothing is held for them). Not a JSON object: the caller's mistake."""
    try:
        params = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        params = None
    if not isinstance(params, dict):
        raise InvalidRequest("kv_transfer_params must be a JSON object", param="kv_transfer_params")
    return params if params.get(REMOTE_PREFILL_KEY) else None


def release_request_id() -> str:
    """The pre-aborted request's id on the decode engine: its own, never a live request's."""
    return f"meshfront-release-{uuid.uuid4().hex}"
