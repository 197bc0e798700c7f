"""The postprocessor as a transport-free service: proto in, proto stream out.

``Postprocessor.generate`` opens the worker call, reads it ahead into a queue (``StreamPump``), and
turns every group of worker messages that is ready into at most one response. The gRPC server wraps
it; the gateway can also call it in-process (then it must ``aclose()`` the generator when it stops
early, which cancels the worker call).

Worker failures surface as ``WorkerFailed``. The decoder keeps the generated ids, which is what a
migration to another worker needs (re-send the prompt plus those ids, max_tokens reduced); that
retry belongs in ``_run`` around the worker call and is not implemented yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2
from services.common.errors import Internal, InvalidRequest, MeshError, WorkerFailed
from services.postprocessor import convert
from services.postprocessor.core.logprobs import TokenTexts
from services.postprocessor.core.sequence import SequenceDecoder
from services.postprocessor.core.tokenizers_cache import ModelTokenizer, TokenizerCache, TokenizerLoadError
from services.postprocessor.pump import StreamPump

log = logging.getLogger(__name__)


class WorkerCall(Protocol):
    """One running ``WorkerService.Generate`` call."""

    async def read(self) -> worker_pb2.GenerateResponse | None:
        """The next message; None when the stream ended cleanly; raises ``MeshError`` on failure."""

    def cancel(self) -> None:
        """Aborts the call (the worker stops generating); a no-op once it has ended."""


class WorkerClient(Protocol):
    """Opens Generate calls on workers by address."""

    def generate(self, address: str, request: worker_pb2.GenerateRequest) -> WorkerCall: ...


class _ResponseBuilder:
    """Per-request state between worker messages and responses.

    Tokens (and their logprobs) whose text is still held back are carried over to the next response
    rather than sent in an empty one; only the first response (usage fields) and the last (finish
    reason) go out without text.
    """

    def __init__(self, decoder: SequenceDecoder, texts: TokenTexts | None):
        self.decoder = decoder
        self._texts = texts
        self._first = True
        self._tokens = 0
        self._logprobs: list[common_pb2.TokenLogprob] = []

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
        if not delta.text and delta.finish is None and not self._first:
            return None
        response = postprocessor_pb2.GenerateResponse(
            text=delta.text, completion_tokens=self._tokens, finish_reason=convert.finish_to_proto(delta.finish),
            stop_reason=delta.stop_reason or "")
        if self._first:
            self._first = False
            response.cached_tokens = messages[0].cached_tokens
            response.prompt_tokens = messages[0].prompt_tokens
        if self._logprobs:
            response.logprobs.extend(convert.token_texts(self._logprobs, self._texts))  # type: ignore[arg-type]
            self._logprobs = []
        self._tokens = 0
        return response


class Postprocessor:
    """Detokenizes, applies stop conditions and coalesces the token stream of a worker.

    Args:
        workers: how to reach workers; by default a ``worker_client.GrpcWorkerClient`` that this
            object owns (``close`` closes its channels).
        tokenizers: shared tokenizer cache; one is created if not given.
    """

    def __init__(self, workers: WorkerClient | None = None, tokenizers: TokenizerCache | None = None):
        self._owned_client = None
        if workers is None:
            from services.postprocessor.worker_client import GrpcWorkerClient  # keeps gRPC out of this module

            workers = self._owned_client = GrpcWorkerClient()
        self._workers = workers
        self._tokenizers = tokenizers or TokenizerCache()

    async def close(self) -> None:
        """Closes the worker channels this object opened (none when ``workers`` was given)."""
        if self._owned_client is not None:
            await self._owned_client.close()

    async def generate(
            self, req: postprocessor_pb2.GenerateRequest) -> AsyncIterator[postprocessor_pb2.GenerateResponse]:
        """Runs ``req`` on its worker and yields text deltas; the last one has a finish reason.

        Raises:
            InvalidRequest: no worker address or model directory.
            WorkerFailed: the worker could not be reached or its stream broke.
            Internal: the model's tokenizer cannot be loaded.
        """
        if not req.worker_address:
            raise InvalidRequest("worker_address is required", param="worker_address")
        model = await self._tokenizer(req.options.model_dir)
        decoder = SequenceDecoder(model.tokenizer, convert.sequence_options(req.request))
        texts = model.texts if req.request.output.HasField("logprobs") else None
        builder = _ResponseBuilder(decoder, texts)
        call = self._workers.generate(req.worker_address, worker_pb2.GenerateRequest(request=req.request))
        pump = StreamPump(call.read, call.cancel)
        try:
            while True:
                batch = await pump.next_batch()
                if batch.messages:
                    response = builder.build(batch.messages)
                    if response is not None:
                        yield response
                    if decoder.finish is not None:
                        return
                if batch.error is not None:
                    raise _as_worker_error(batch.error, req.worker_address)
                if batch.ended:
                    raise WorkerFailed("worker ended the stream without a finish reason")
        finally:
            # Also runs when the caller cancels or closes us: the worker must stop generating at once.
            pump.close()

    async def _tokenizer(self, model_dir: str) -> ModelTokenizer:
        cached = self._tokenizers.get(model_dir)
        if cached is not None:
            return cached
        if not model_dir:
            raise InvalidRequest("options.model_dir is required", param="options.model_dir")
        try:
            # Reading a 150k-vocabulary tokenizer.json takes ~1 s: keep it off the event loop.
            return await asyncio.to_thread(self._tokenizers.load, model_dir)
        except TokenizerLoadError as e:
            log.error("%s", e)
            raise Internal("the model's tokenizer cannot be loaded") from e


def _as_worker_error(error: BaseException, address: str) -> MeshError:
    """Errors with a domain reason pass through; anything else means the worker failed."""
    if isinstance(error, MeshError):
        return error
    log.warning("worker %s stream failed: %r", address, error)
    return WorkerFailed("worker failed")
