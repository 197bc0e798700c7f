"""Per-request state between worker messages and responses: the request's one decoder, its parsers, and what
the next response still owes (token counts, logprobs, the ids named for a resume).

Every attempt of the request (aggregated or either order of a split one, after any migration) feeds the same
builder, so the caller sees one stream whichever worker produced the tokens.
"""

from __future__ import annotations

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import InvalidRequest
from services.postprocessor import convert
from services.postprocessor.core.logprobs import TokenTexts
from services.postprocessor.core.parsers.backends import StreamingOutputParser
from services.postprocessor.core.parsers.types import concat
from services.postprocessor.core.sequence import Delta, FinishReason, SequenceDecoder


class ResponseBuilder:
    """Per-request state between worker messages and responses.

    Tokens (and their logprobs) whose text is still held back are carried over to the next response
    rather than sent in an empty one; only the first response (usage fields) and the last (finish
    reason) go out without text.
    """

    def __init__(self, decoder: SequenceDecoder, texts: TokenTexts | None,
                 parser: StreamingOutputParser | None = None):
        self.decoder = decoder
        self._texts = texts
        self._parser = parser  # None: the text is plain content (no tools, no reasoning parser)
        self._first = True
        self._tokens = 0
        self._reported = 0  # decoder.generated_ids[:_reported] were named in responses already
        self._logprobs: list[common_pb2.TokenLogprob] = []

    @property
    def first(self) -> bool:
        """No response was built yet (the first one carries the usage fields and goes at once)."""
        return self._first

    def replay(self, ids: list[int]) -> None:
        """Takes in ids whose output another replica already sent (``GenerateRequest.resume``): the decoder,
        stop-string hold-back and parsers end up as they were there after its last response, and the next
        response carries only what follows."""
        delta = self.decoder.step(ids)
        if self.decoder.finish is not None or delta.tokens != len(ids):
            # The replica that sent them would have finished the sequence with them: they are not its output.
            raise InvalidRequest("resume.token_ids end the sequence", param="resume.token_ids")
        if self._parser is not None and ids:
            self._parser.feed(delta.text, ids)
        self._first = False  # the usage fields of the first response went out already
        self._reported = len(self.decoder.generated_ids)

    def build(self, messages: list[worker_pb2.GenerateResponse]) -> postprocessor_pb2.GenerateResponse | None:
        ids: list[int] = []
        logprobs: list[common_pb2.TokenLogprob] = []
        worker_finish = 0
        for message in messages:
            ids.extend(message.token_ids)
            if self._texts is not None:
                logprobs.extend(message.logprobs)
            worker_finish = message.finish_reason or worker_finish
        delta = self.decoder.step(ids, convert.finish_from_proto(worker_finish))
        self._tokens += delta.tokens
        if self._texts is not None:
            self._logprobs.extend(logprobs[:delta.tokens])
        if self._parser is not None:
            return self._parsed(delta, messages, ids[:delta.tokens])
        if not delta.text and delta.finish is None and not self._first:
            return None
        response = postprocessor_pb2.GenerateResponse(
            text=delta.text, completion_tokens=self._tokens, finish_reason=convert.finish_to_proto(delta.finish),
            stop_reason=delta.stop_reason or "")
        return self._complete(response, messages)

    def _parsed(self, delta: Delta, messages: list[worker_pb2.GenerateResponse],
                ids: list[int]) -> postprocessor_pb2.GenerateResponse | None:
        """The delta through the reasoning / tool-call parsers: text they hold back waits like held tokens."""
        parser = self._parser
        assert parser is not None
        parsed = parser.feed(delta.text, ids) if delta.text or ids else None  # engine backends need the ids
        if delta.finish is not None:
            parsed = concat(parsed, parser.finish())
        if not parsed and delta.finish is None and not self._first:
            return None
        finish = convert.finish_to_proto(delta.finish)
        if delta.finish in (FinishReason.EOS, FinishReason.STOP) and parser.ends_with_tool_calls:
            finish = common_pb2.FINISH_REASON_TOOL_CALLS
        response = postprocessor_pb2.GenerateResponse(completion_tokens=self._tokens, finish_reason=finish,
                                                      stop_reason=delta.stop_reason or "")
        if parsed:
            response.text, response.reasoning_text = parsed.content, parsed.reasoning
            response.tool_calls.extend(postprocessor_pb2.ToolCallDelta(index=c.index, id=c.id, name=c.name,
                                                                       arguments=c.arguments)
                                       for c in parsed.tool_calls)
        return self._complete(response, messages)

    def _complete(self, response: postprocessor_pb2.GenerateResponse,
                  messages: list[worker_pb2.GenerateResponse]) -> postprocessor_pb2.GenerateResponse:
        if self._first:
            self._first = False
            response.cached_tokens = messages[0].cached_tokens
            response.prompt_tokens = messages[0].prompt_tokens
        generated = self.decoder.generated_ids
        if len(generated) > self._reported:  # one extend per response: the ids the caller resumes from
            response.token_ids.extend(generated[self._reported:])
            self._reported = len(generated)
        if self._logprobs:
            response.logprobs.extend(convert.token_texts(self._logprobs, self._texts))  # type: ignore[arg-type]
            self._logprobs = []
        self._tokens = 0
        return response
