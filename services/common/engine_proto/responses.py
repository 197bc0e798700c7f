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
_Part: TypeAlias = (vllm_engine_pb2.GenerateStreamChunk | vllm_engine_pb2.GenerateComplete
                    | sglang_scheduler_pb2.GenerateStreamChunk | sglang_scheduler_pb2.GenerateComplete
                    | trtllm_service_pb2.GenerateStreamChunk | trtllm_service_pb2.GenerateComplete)
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

    def read(self, messages: Sequence[GenerateResponse]) -> worker_pb2.GenerateResponse:
        """The messages that arrived together, in order, as one worker response: the reader takes whatever is
        ready at once (services/common/pump.py), so a consumer that fell behind costs one response, not one per
        engine step. Usage counts are the first message's, as our workers send them."""
        out = worker_pb2.GenerateResponse()
        for i, message in enumerate(messages):
            kind = message.WhichOneof("response")
            if kind == "chunk":
                part: _Part = message.chunk
                ids, logprobs_from = part.token_ids, 0
            elif kind == "complete":
                part = done = message.complete
                trtllm = isinstance(done, trtllm_service_pb2.GenerateComplete)
                every = done.output_token_ids if trtllm else done.output_ids
                ids, logprobs_from = every[self._seen:], self._seen  # only the ids past those the chunks brought
                out.finish_reason = self._finish(done)
            else:
                raise ValueError("an engine response with neither chunk nor complete")
            if i == 0:
                out.prompt_tokens, out.cached_tokens = part.prompt_tokens, part.cached_tokens
            if ids:
                out.token_ids.extend(ids)
                out.logprobs.extend(_logprobs(part)[logprobs_from:])
                self._seen += len(ids)
        return out

    def _finish(self, done: vllm_engine_pb2.GenerateComplete | sglang_scheduler_pb2.GenerateComplete
                | trtllm_service_pb2.GenerateComplete) -> common_pb2.FinishReason:
        if done.finish_reason == "stop":
            # A matched id that is not an EOS is one of the hidden stop ids (STOP); none matched, or an EOS: EOS.
            matched = done.matched_token_id if done.WhichOneof("matched_stop") == "matched_token_id" else None
            return _F.FINISH_REASON_STOP if matched is not None and matched not in self._eos else _F.FINISH_REASON_EOS
        return _FINISH.get(done.finish_reason, _F.FINISH_REASON_ERROR)


def _logprobs(message: _Part) -> list[common_pb2.TokenLogprob]:
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
