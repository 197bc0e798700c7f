"""A real transformers causal LM on the CPU, one sequence at a time.

Generation is a manual KV-cache decode loop (``model(ids, cache=..., use_cache=True)``)
in a dedicated worker thread, because torch calls block. Each token is handed to the request's
``TokenStream`` with ``loop.call_soon_threadsafe``; the stream coalesces whatever the gRPC writer
has not taken yet. The loop checks an abort flag before every forward pass, so a cancelled request
stops within one token.

Why one sequence at a time: a CPU forward pass already uses every core, so batching would add
padding and bookkeeping for little gain on the tiny test models this worker exists for. Requests
queue on a lock in arrival order; the lock is released only when the decode thread has really
stopped, so two sequences never share the model. The worker reports no KV cache
(``cached_tokens`` is always 0): every request recomputes its prompt.

torch is the ``hf`` extra; it is imported when the model loads, never by the rest of the mesh.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from services.workers.engine import (
    EngineError,
    EngineOutput,
    EngineRequest,
    FinishReason,
    RequestRejected,
    TokenStream,
)
from services.workers.thinking_budget import ThinkingBudget, ThinkingMarkers, check

log = logging.getLogger(__name__)


class HfEngine:
    """Implements ``services.workers.engine.Engine`` over a transformers model directory."""

    def __init__(self, model_dir: str, *, context_length: int, eos_token_ids: Sequence[int] = (),
                 threads: int = 0, thinking: ThinkingMarkers | None = None):
        self.model_dir = model_dir
        # The thinking block's markers, from the worker's reasoning parser (services/workers/thinking_budget.py).
        self.thinking = thinking or ThinkingMarkers(why_not="the worker registers no reasoning parser")
        self.context_length = context_length
        self.eos_token_ids = tuple(eos_token_ids)
        self.threads = threads
        self._model: Any = None
        self._load_lock = asyncio.Lock()
        self._model_lock = asyncio.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-decode")
        self._aborts: set[threading.Event] = set()
        self._cache_kwarg = "past_key_values"

    @property
    def busy(self) -> bool:
        return self._model_lock.locked()

    async def start(self) -> None:
        """Loads the model (seconds, in the decode thread so the event loop stays responsive)."""
        async with self._load_lock:
            if self._model is None:
                self._model = await asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def _load(self) -> Any:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        model.eval()
        # transformers renamed past_key_values to cache (5.2x); use whichever this version takes.
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        log.info("loaded %s (%d parameters)", self.model_dir, sum(p.numel() for p in model.parameters()))
        return model

    async def close(self) -> None:
        for abort in list(self._aborts):
            abort.set()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        prompt = list(request.token_ids)
        max_tokens = self._max_tokens(prompt, request)
        await self.start()
        stream = TokenStream(logprobs=request.logprobs is not None)
        stream.set_prompt_info(len(prompt), 0)
        abort = threading.Event()
        loop = asyncio.get_running_loop()
        await self._model_lock.acquire()
        try:
            future = loop.run_in_executor(self._executor, self._decode, prompt, request, max_tokens, stream, loop,
                                          abort)
        except BaseException:
            self._model_lock.release()
            raise
        self._aborts.add(abort)

        def decode_stopped(_: asyncio.Future) -> None:
            self._aborts.discard(abort)
            self._model_lock.release()

        future.add_done_callback(decode_stopped)
        try:
            async for output in stream:
                yield output
        finally:
            abort.set()
            stream.close()

    def _max_tokens(self, prompt: list[int], request: EngineRequest) -> int:
        if request.guided is not None:
            raise RequestRejected(f"the hf worker has no guided decoding ({request.guided.kind()} was asked for)")
        check(request, "hf", self.thinking)
        if not prompt:
            raise RequestRejected("the prompt is empty")
        room = self.context_length - len(prompt)
        if room <= 0:
            raise RequestRejected(f"the prompt has {len(prompt)} tokens; the context window is {self.context_length}")
        if request.max_tokens is not None and request.max_tokens <= 0:
            raise RequestRejected("max_tokens must be at least 1")
        return room if request.max_tokens is None else min(request.max_tokens, room)

    # -- the decode thread ------------------------------------------------------------------------

    def _decode(self, prompt: list[int], request: EngineRequest, max_tokens: int, stream: TokenStream,
                loop: asyncio.AbstractEventLoop, abort: threading.Event) -> None:
        try:
            self._decode_loop(prompt, request, max_tokens, stream, loop, abort)
        except Exception as e:  # a model error must end the stream, not hang it
            if loop.is_closed():  # shutting down: nobody is listening any more
                return
            log.exception("decode failed for %s", request.request_id)
            loop.call_soon_threadsafe(stream.fail, EngineError(f"decode failed: {type(e).__name__}"))

    def _decode_loop(self, prompt: list[int], request: EngineRequest, max_tokens: int, stream: TokenStream,
                     loop: asyncio.AbstractEventLoop, abort: threading.Event) -> None:
        import torch

        from services.workers.hf.sampling import TokenHistory, pick_token

        model = self._model
        params = request.sampling
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        eos = () if request.ignore_eos else (request.eos_token_ids or self.eos_token_ids)
        budget = None
        if request.max_thinking_tokens is not None:
            budget = ThinkingBudget(self.thinking, request.max_thinking_tokens, prompt)
        history = None
        if params.frequency_penalty or params.presence_penalty or params.repetition_penalty:
            history = TokenHistory(model.config.vocab_size, prompt)
        input_ids = torch.tensor([prompt], dtype=torch.long)
        cache = None
        with torch.inference_mode():
            for produced in range(max_tokens):
                if abort.is_set():
                    return
                # logits_to_keep=1: only the last position's logits (not prompt x vocabulary).
                out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
                cache = out.get(self._cache_kwarg)
                banned = eos if produced < request.min_tokens else ()
                forced = budget.forced() if budget is not None else None
                token, logprob = pick_token(out.logits[0, -1], params, generator=generator, banned=banned,
                                            history=history, top_logprobs=request.logprobs, forced=forced)
                if budget is not None:
                    budget.observe(token)
                if history is not None:
                    history.add(token)
                finish = FinishReason.NONE
                if token in eos:
                    finish = FinishReason.EOS
                elif produced + 1 >= max_tokens:
                    finish = FinishReason.LENGTH
                loop.call_soon_threadsafe(stream.push, token, logprob, finish)
                if finish:
                    return
                input_ids = torch.tensor([[token]], dtype=torch.long)
