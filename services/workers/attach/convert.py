"""SMG's engine proto (the ``smg-grpc-proto`` package) to attach's core and to the KV translator's events: the only
module of attach that reads the engines' messages.

The three services share their KV event and health messages (``smg.grpc.common``) but each has its own model info,
server info and load messages; where one lacks a field the card needs, the value is 0 ("not said") and the core
asks for the flag (``--block-size``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import orjson
from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    trtllm_service_pb2,
    trtllm_service_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

from services.common.engine_proto import SAMPLING_DEFAULT_KNOBS
from services.workers.attach.core import (
    SGLANG_SCHEDULER,
    TRTLLM_SERVICE,
    VLLM_ENGINE,
    CannotAttach,
    EngineInfo,
    EngineLoad,
)
from services.workers.engine_kv import BlocksRemoved, BlocksStored, CacheCleared, EngineKvEvent


@dataclasses.dataclass(frozen=True)
class Protocol:
    """One engine service: its messages, its stub class, and whether it answers GetLoads."""

    messages: ModuleType
    stub: Any
    has_loads: bool


PROTOCOLS = {
    VLLM_ENGINE: Protocol(vllm_engine_pb2, vllm_engine_pb2_grpc.VllmEngineStub, True),
    SGLANG_SCHEDULER: Protocol(sglang_scheduler_pb2, sglang_scheduler_pb2_grpc.SglangSchedulerStub, True),
    TRTLLM_SERVICE: Protocol(trtllm_service_pb2, trtllm_service_pb2_grpc.TrtllmServiceStub, False),
}


def engine_info(protocol: str, model: Any, server: Any) -> EngineInfo:
    """The card's inputs from GetModelInfo's and GetServerInfo's answers.

    Raises:
        CannotAttach: the engine's sampling defaults are not a JSON object of numbers."""
    if protocol == VLLM_ENGINE:
        return EngineInfo(served_model_name=model.served_model_name, model_path=model.model_path,
                          context_length=model.max_context_length, block_size=server.block_size,
                          is_generation=model.is_generation, data_parallel_size=max(1, server.data_parallel_size),
                          sampling_defaults=sampling_defaults(model.default_sampling_params_json))
    if protocol == SGLANG_SCHEDULER:  # its page size is in server_args (a Struct), read where present
        args = server.server_args
        page = int(args["page_size"]) if "page_size" in args.fields else 0
        dp = int(args["dp_size"]) if "dp_size" in args.fields else 1
        return EngineInfo(served_model_name=model.served_model_name, model_path=model.model_path,
                          context_length=model.max_context_length, block_size=page,
                          is_generation=model.is_generation, data_parallel_size=max(1, dp),
                          sampling_defaults=sampling_defaults(model.default_sampling_params_json))
    # TensorRT-LLM says neither a served name nor a block size: --model-name/--block-size say them
    return EngineInfo(served_model_name="", model_path=model.model_id, context_length=model.max_seq_len,
                      block_size=0)


def sampling_defaults(raw: str) -> tuple[tuple[str, float], ...]:
    """GetModelInfo's ``default_sampling_params_json`` (the model's generation config, as the engine resolved it):
    the knobs a request of ours can leave unset (SAMPLING_DEFAULT_KNOBS), in that order. Others the engine may list
    (max_tokens, say) are not sampling knobs the mesh leaves to it."""
    if not raw:
        return ()
    try:
        values = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise CannotAttach(f"the engine's sampling defaults are not JSON: {e}") from e
    if not isinstance(values, dict):
        raise CannotAttach(f"the engine's sampling defaults are not a JSON object: {raw[:200]}")
    out = []
    for knob in SAMPLING_DEFAULT_KNOBS:
        value = values.get(knob)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CannotAttach(f"the engine's default {knob} is not a number: {value!r}")
        out.append((knob, float(value)))
    return tuple(out)


def loads(response: Any) -> EngineLoad | None:
    """GetLoads's answer for an engine without ranks (its first entry), None when it lists none."""
    if not response.loads:
        return None
    first = response.loads[0]
    return EngineLoad(running=first.num_running_reqs, waiting=first.num_waiting_reqs,
                      token_usage=first.token_usage, total_tokens=first.max_total_num_tokens)


def batch_load(batch: common_pb2.KvEventBatch, total_tokens: int) -> EngineLoad | None:
    """A KV event batch's load record (servicers that predate it send none): its capacity is GetLoads's."""
    if not batch.HasField("load"):
        return None
    return EngineLoad(running=batch.load.running_requests, waiting=batch.load.waiting_requests,
                      token_usage=batch.load.token_usage, total_tokens=total_tokens)


def kv_events(batch: common_pb2.KvEventBatch, block_size: int) -> Sequence[EngineKvEvent]:
    """The translator's events of one batch (services/workers/engine_kv.py recomputes our hashes from the token
    ids). Blocks in another tier, another cache group or remote, and blocks whose hash took media in, are left
    out: no prompt hash of ours could match them (their children then go unindexed, as the translator counts)."""
    out: list[EngineKvEvent] = []
    for event in batch.events:
        kind = event.WhichOneof("data")
        if kind == "cleared":
            out.append(CacheCleared())
        elif kind == "removed":
            if _elsewhere(event.removed):
                continue
            out.append(BlocksRemoved(tuple(event.removed.block_hashes)))
        elif kind == "stored":
            stored = event.stored
            if _elsewhere(stored) or any(key.HasField("multimodal") for b in stored.blocks for key in b.extra_keys):
                continue
            tokens = [t for b in stored.blocks for t in b.token_ids]
            size = stored.blocks[0].block_size if stored.blocks and stored.blocks[0].block_size else block_size
            out.append(BlocksStored(tuple(b.block_hash for b in stored.blocks),
                                    stored.parent_block_hash if stored.HasField("parent_block_hash") else None,
                                    tokens, size,
                                    lora_name=stored.lora_name if stored.HasField("lora_name") else None))
    return out


def _elsewhere(event: Any) -> bool:
    """Not the engine's own device copy in its first cache group."""
    tier = event.tier if event.HasField("tier") else common_pb2.KV_CACHE_TIER_UNSPECIFIED
    return (tier not in (common_pb2.KV_CACHE_TIER_UNSPECIFIED, common_pb2.KV_CACHE_TIER_DEVICE)
            or (event.HasField("group_idx") and event.group_idx != 0)
            or (event.HasField("locality") and event.locality == common_pb2.KV_CACHE_LOCALITY_REMOTE))
