"""Warm before ready: one request per worker through the whole path before the gateway serves.

Every stage warms a model's artifacts when it discovers the model (services/common/warmup.py), but
that races the first client: the gateway lists a model as soon as its worker registers, while the
postprocessor may still be reading a 150k-token tokenizer. So the gateway sends each worker one
request of ordinary size through its own pipeline (preprocess, route pinned to that worker, generate,
release): it waits for every stage to be warm and opens every channel on the way. Until the workers
known at start are done, the gateway's gRPC health is NOT_SERVING (what Envoy and Kubernetes probe)
and /health says "warming"; workers that register later are warmed as soon as they appear, while the
gateway serves. A worker whose warm-up keeps failing is logged and does not hold readiness back past
the deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2

from services.common.discovery import CHAT, COMPLETIONS, DECODE, PREFILL, ModelCard, WorkerCard, WorkerRegistry
from services.common.errors import InvalidRequest, MeshError
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.core.pipeline import Pipeline
from services.gateway.core.to_proto import chat_to_preprocess, completion_to_preprocess
from services.gateway.core.trace import RouteHints

log = logging.getLogger(__name__)

SYNC_WAIT_S = 10.0  # how long the first discovery view may take before warming what is known
DEADLINE_S = 60.0  # per model: then readiness stops waiting for it
RETRY_S = 1.0
EMPTY_WAIT_S = 10.0  # no model registered in this long: ready anyway (an empty mesh still answers)
POLL_S = 0.05
# The warm-up is shaped like a client's request: a prompt of a few hundred tokens and several tokens out,
# so that every process has been through the paths a one-token "Hi" skips (full KV blocks to hash and
# book, several decode steps, messages of a real request's size) before the first client comes.
WARM_PROMPT = " ".join(["Every stage of the mesh handles one request of ordinary size before it serves."] * 16)
WARM_TOKENS = 8
_NO_OPTIONS = common_pb2.PostprocessOptions()  # a warm-up asks for no tools and the default interval
_NO_HINTS = RouteHints()
WARM_MIN_CONTEXT = 1024  # a model with a smaller (or unknown) window gets the one-token "Hi" instead


class Warmup:
    def __init__(self, pipeline: Pipeline, registry: WorkerRegistry, *, deadline_s: float = DEADLINE_S,
                 retry_s: float = RETRY_S, empty_wait_s: float = EMPTY_WAIT_S):
        self._pipeline = pipeline
        self._registry = registry
        self._deadline_s = deadline_s
        self._retry_s = retry_s
        self._empty_wait_s = empty_wait_s
        self._started: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self.ready = asyncio.Event()  # the models known at start are warm (or gave up)
        registry.subscribe(self._on_change)

    @property
    def warming(self) -> list[str]:
        """Workers whose warm-up request is still running."""
        return sorted(t.get_name().removeprefix("warm-") for t in self._tasks)

    async def run(self) -> None:
        """Sets ``ready`` once the gateway knows a worker and every worker it knows is warm (or gave up).

        At start the stages race each other and the workers register one by one, so "known" is
        whatever discovery has shown by the time the warm-ups in flight end. A mesh with no model at
        all is ready after ``empty_wait_s``: it answers /v1/models with an empty list, as before.
        """
        try:
            async with asyncio.timeout(SYNC_WAIT_S):
                await self._registry.synced.wait()
        except TimeoutError:
            log.warning("no discovery view after %.0f s: waiting for models without it", SYNC_WAIT_S)
        since = time.monotonic()
        while not (self._started and not self._tasks) and (
                self._started or time.monotonic() - since < self._empty_wait_s):
            await asyncio.sleep(POLL_S)  # only while the gateway starts
        self.ready.set()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _on_change(self, worker_id: str, card: WorkerCard | None) -> None:
        if card is None or worker_id in self._started:
            return
        self._started.add(worker_id)
        if card.model.is_embedding:
            return  # its one stage besides the worker (the preprocessor's tokenizer) warms itself
        task = asyncio.get_running_loop().create_task(self._warm(worker_id, card.model, card.role),
                                                      name=f"warm-{worker_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm(self, worker_id: str, model: ModelCard, role: str) -> None:
        started = time.monotonic()
        pin, hints = _pins(worker_id, role)
        deadline = started + self._deadline_s
        kinds = [kind for kind in (CHAT, COMPLETIONS) if model.serves(kind)]
        while kinds:
            try:
                # Pinned: each worker's own channels (postprocessor -> worker) open now too.
                async for _ in self._pipeline.run([_request(model, kinds[0])], 1, pin, hints, options=_NO_OPTIONS):
                    pass
                log.info("worker %s (%s) warm in %.0f ms", worker_id, model.name,
                         (time.monotonic() - started) * 1000)
                return
            except InvalidRequest as e:  # e.g. chat on a model without a template: try its other kind
                log.info("warming worker %s with %s: %s", worker_id, kinds.pop(0), e.message)
            except MeshError as e:
                if time.monotonic() + self._retry_s > deadline:
                    log.warning("worker %s (%s) did not warm up in %.0f s (%s); serving it cold", worker_id,
                                model.name, self._deadline_s, e.message)
                    return
                log.info("warming worker %s: %s; retrying", worker_id, e.message)
                await asyncio.sleep(self._retry_s)


def _pins(worker_id: str, role: str) -> tuple[str, RouteHints]:
    """How a worker's warm-up request is pinned to it: (the aggregated pin, the split pins).

    A prefill worker runs only prefill legs, and a decode worker may be unable to run a request whole (SGLang's
    decode server dials the bootstrap every request names), so each warms in its own leg of a split request
    whose other worker the router picks (aggregated still, where no prefill worker is registered and the
    router does not enforce disaggregation); a ``both`` worker warms with the request whole."""
    if role == PREFILL:
        return "", RouteHints(prefill_worker_id=worker_id)
    if role == DECODE:
        return "", RouteHints(decode_worker_id=worker_id)
    return worker_id, _NO_HINTS


def _request(model: ModelCard, kind: str) -> preprocessor_pb2.PreprocessRequest:
    """A chat turn or a completion of ordinary size, or of one token where the window may be small."""
    rid = f"warmup-{model.name}-{time.monotonic_ns()}"
    ordinary = model.context_length >= WARM_MIN_CONTEXT
    prompt, max_tokens = (WARM_PROMPT, WARM_TOKENS) if ordinary else ("Hi", 1)
    if kind == CHAT:
        body = {"model": model.name, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
        return chat_to_preprocess(parse_chat(orjson.dumps(body)), rid)
    req = parse_completion(orjson.dumps({"model": model.name, "prompt": prompt, "max_tokens": max_tokens}))
    return completion_to_preprocess(req, req.prompts[0], rid)
