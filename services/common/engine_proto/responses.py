"""An engine service's streamed Generate responses as our worker's ``GenerateResponse``s.

The three services stream chunks of new token ids, then one complete message with the finish reason. The
complete message's ids differ by engine: vLLM's servicer repeats the last chunk's delta, TensorRT-LLM's
sends every output id so far. Taking only its ids past those the chunks already brought reads both
right (and an engine that sends its last ids in the complete message alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2
from smg_grpc_proto import sglang_scheduler_pb2, trtllm_service_pb2, vllm_engine_pb2

GenerateResponse: TypeAlias = (vllm_engine_pb2.GenerateResponse | sglang_scheduler_pb2.GenerateResponse
                    | trtllm_service_pb2.GenerateResponse)
EmbedResponse: TypeAlias = (vllm_engine_pb2.EmbedResponse | sglang_scheduler_pb2.EmbedResponse
                            | trtllm_service_pb2.EmbedResponse)
_OutputLogProbs: TypeAlias = vllm_engine_pb2.OutputLogProbs | sglang_scheduler_pb2.OutputLogProbs

_F = common_pb2
# The engines' finish reasons (OpenAI's words, and TensorRT-LLM's stop_word); "stop" is resolved below.
_FINISH = {"length": _F.FINISH_REASON_LENGTH, "abort": _F.FINISH_REASON_CANCELLED,
           "stop_word": _F.FINISH_REASON_STOP}


class EngineStream:
    """Reads one Generate call's responses, in order, into worker responses."""

    def __init__(self, eos_token_ids: Sequence[int]):
        self._eos = frozenset(eos_token_ids)
        self._seen = 0  # output ids the chunks brought so far

    def read(self, message: GenerateResponse) -> worker_pb2.GenerateResponse:
        kind = message.WhichOneof("response")
        if kind == "chunk":
            chunk = message.chunk
            out = worker_pb2.GenerateResponse(token_ids=chunk.token_ids, prompt_tokens=chunk.prompt_tokens,
                                              cached_tokens=chunk.cached_tokens)
            out.logprobs.extend(_logprobs(chunk))
            self._seen += len(chunk.token_ids)
            return out
        if kind != "complete":
            raise ValueError("an engine response with neither chunk nor complete")
        done = message.complete
        ids = done.output_token_ids if isinstance(done, trtllm_service_pb2.GenerateComplete) else done.output_ids
        out = worker_pb2.GenerateResponse(token_ids=ids[self._seen:], prompt_tokens=done.prompt_tokens,
                                          cached_tokens=done.cached_tokens, finish_reason=self._finish(done))
        if len(ids) > self._seen:
            out.logprobs.extend(_logprobs(done)[self._seen:])
            self._seen = len(ids)
        return out

    def _finish(self, done: vllm_engine_pb2.GenerateComplete | sglang_scheduler_pb2.GenerateComplete
                | trtllm_service_pb2.GenerateComplete) -> common_pb2.FinishReason:
        if done.finish_reason == "stop":
            # A matched id that is not an EOS is one of the hidden stop ids (STOP); none matched, or an EOS: EOS.
            matched = done.matched_token_id if done.WhichOneof("matched_stop") == "matched_token_id" else None
            return _F.FINISH_REASON_STOP if matched is not None and matched not in self._eos else _F.FINISH_REASON_EOS
        return _FINISH.get(done.finish_reason, _F.FINISH_REASON_ERROR)


def _logprobs(message: object) -> list[common_pb2.TokenLogprob]:
    """A chunk's or complete message's logprobs, one per output id it carries ([] when none were asked)."""
    if isinstance(message, (trtllm_service_pb2.GenerateStreamChunk, trtllm_service_pb2.GenerateComplete)):
        return [common_pb2.TokenLogprob(token_id=t.token_id, logprob=t.logprob,
                                        top=[common_pb2.TopLogprob(token_id=a.token_id, logprob=a.logprob)
                                             for a in t.top_logprobs])
                for t in message.logprobs]
    assert isinstance(message, (vllm_engine_pb2.GenerateStreamChunk, vllm_engine_pb2.GenerateComplete,
                                sglang_scheduler_pb2.GenerateStreamChunk, sglang_scheduler_pb2.GenerateComplete))
    lp: _OutputLogProbs = message.output_logprobs
    tops = lp.top_logprobs
    return [common_pb2.TokenLogprob(
        token_id=token_id, logprob=logprob,
        top=[common_pb2.TopLogprob(token_id=t, logprob=v) for t, v in zip(tops[i].token_ids, tops[i].values,
                                                                          strict=True)] if i < len(tops) else [])
        for i, (token_id, logprob) in enumerate(zip(lp.token_ids, lp.token_logprobs, strict=True))]


def embedding(response: EmbedResponse) -> list[float]:
    """The one vector an Embed call returns."""
    return list(response.embedding)
