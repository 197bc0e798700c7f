"""Conversions between the worker protos and the engine's dataclasses, and engine errors to MeshErrors.

The only module of the worker glue that knows both worlds.
"""

from __future__ import annotations

from typing import Any, cast

import orjson
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import InvalidRequest, MeshError, Overloaded, WorkerFailed
from services.workers.engine import (
    EngineBusy,
    EngineError,
    EngineOutput,
    EngineRequest,
    GuidedDecoding,
    KvTransferFailed,
    MediaInput,
    RequestRejected,
    SamplingParams,
)


def _opt(message, field: str):
    return getattr(message, field) if message.HasField(field) else None


def sampling_from_proto(s: common_pb2.SamplingOptions) -> SamplingParams:
    return SamplingParams(
        temperature=_opt(s, "temperature"),
        top_p=_opt(s, "top_p"),
        top_k=_opt(s, "top_k"),
        seed=_opt(s, "seed"),
        min_p=_opt(s, "min_p"),
        frequency_penalty=_opt(s, "frequency_penalty"),
        presence_penalty=_opt(s, "presence_penalty"),
        repetition_penalty=_opt(s, "repetition_penalty"),
    )


def request_from_proto(request: worker_pb2.GenerateRequest) -> EngineRequest:
    r = request.request
    stop = r.stop
    # With ignore_eos the preprocessor sends no EOS ids; drop any anyway so engines need one check.
    eos = () if stop.ignore_eos else tuple(r.eos_token_ids)
    # The preprocessor folds the EOS ids into the hidden stop ids; the rest end with finish STOP.
    stop_ids = tuple(i for i in stop.stop_token_ids_hidden if i not in eos)
    return EngineRequest(
        request_id=r.request_id,
        token_ids=list(r.token_ids),
        sampling=sampling_from_proto(r.sampling),
        max_tokens=_opt(stop, "max_tokens"),
        min_tokens=stop.min_tokens,
        eos_token_ids=eos,
        stop_token_ids=stop_ids,
        ignore_eos=stop.ignore_eos,
        logprobs=_opt(r.output, "logprobs"),
        guided=guided_from_proto(r.sampling),
        media=tuple(media_from_proto(m) for m in r.media),
        max_thinking_tokens=_opt(stop, "max_thinking_tokens"),
        kv_transfer_params=transfer_params_from_proto(r),
        dp_rank=r.dp_rank if r.HasField("dp_rank") else None,
    )


def media_from_proto(m: common_pb2.MediaItem) -> MediaInput:
    return MediaInput(m.modality, m.url, m.data, m.format, content=m.content, mime_type=m.mime_type,
                      content_hash=m.content_hash, uuid=m.uuid, token_offset=m.token_offset,
                      token_count=m.token_count, width=m.width, height=m.height)


def transfer_params_from_proto(r: common_pb2.PreprocessedRequest) -> dict[str, Any] | None:
    """A leg's ``kv_transfer_params`` as vLLM takes them; None for an aggregated request. A prefill leg that
    brought none asks for a remote decode, as vLLM's ``{"do_remote_decode": true}`` does."""
    role = r.disaggregation.role
    if role == common_pb2.DISAGGREGATION_ROLE_UNSPECIFIED:
        return None
    raw = r.disaggregation.kv_transfer_params
    try:
        params = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        params = None
    if not isinstance(params, dict):
        raise InvalidRequest("disaggregation.kv_transfer_params must be a JSON object", param="kv_transfer_params")
    if role == common_pb2.DISAGGREGATION_ROLE_PREFILL:
        params.setdefault("do_remote_decode", True)
    return params


def guided_from_proto(s: common_pb2.SamplingOptions) -> GuidedDecoding | None:
    """The output constraint, or None; more than one kind at once is the client's mistake."""
    if not s.HasField("guided_decoding"):
        return None
    g = s.guided_decoding
    guided = GuidedDecoding(json_schema=g.json_schema or None, json_object=g.json_object, regex=g.regex or None,
                            choice=tuple(g.choice), grammar=g.grammar or None, structural_tag=g.structural_tag or None)
    kinds = [k for k in ("json_schema", "json_object", "regex", "choice", "grammar", "structural_tag")
             if getattr(guided, k)]
    if len(kinds) > 1:
        raise InvalidRequest(f"guided decoding takes one constraint, got {' and '.join(kinds)}")
    return guided if kinds else None


def output_to_proto(output: EngineOutput) -> worker_pb2.GenerateResponse:
    # FinishReason's values equal the proto enum's (services/workers/engine.py); the stubs type enums as classes.
    finish = cast(common_pb2.FinishReason, int(output.finish_reason))
    response = worker_pb2.GenerateResponse(token_ids=output.token_ids, finish_reason=finish)
    if output.prompt_tokens is not None:
        response.prompt_tokens = output.prompt_tokens
        response.cached_tokens = output.cached_tokens or 0
    if output.kv_transfer_params is not None:
        response.kv_transfer_params = orjson.dumps(output.kv_transfer_params)
    if output.logprobs:
        response.logprobs.extend(
            common_pb2.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob,
                                    top=[common_pb2.TopLogprob(token_id=t, logprob=p) for t, p in lp.top])
            for lp in output.logprobs)
    return response


def engine_error(err: EngineError) -> MeshError:
    """Rejections keep their message (the client's fault); failures do not leak internals."""
    if isinstance(err, RequestRejected):
        return InvalidRequest(str(err), param=err.param)
    if isinstance(err, EngineBusy):
        return Overloaded(str(err), code="overloaded")
    if isinstance(err, KvTransferFailed):  # the prefill worker's blocks are to blame, not this worker
        return WorkerFailed(f"the KV transfer failed: {err}", param="kv_transfer_params")
    return WorkerFailed(f"the engine failed: {err}")
