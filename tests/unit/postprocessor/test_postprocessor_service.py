"""Postprocessor.generate in-process, against a scripted fake WorkerClient (no sockets)."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import InvalidRequest, WorkerFailed
from services.models.qwen import EOS_TOKEN_IDS
from services.postprocessor.core.tokenizers_cache import TokenizerCache
from services.postprocessor.service import Postprocessor
from tests.unit.postprocessor.stream_pump import StreamPump

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

EOS = common_pb2.FINISH_REASON_EOS
LENGTH = common_pb2.FINISH_REASON_LENGTH
STOP = common_pb2.FINISH_REASON_STOP


class FakeCall:
    """Replays scripted worker messages; ``None`` in the script blocks until cancelled."""

    def __init__(self, script):
        self._script = list(script)
        self.cancelled = asyncio.Event()

    async def read(self):
        if not self._script:
            return None
        item = self._script.pop(0)
        if item is None:
            await self.cancelled.wait()
            raise WorkerFailed("cancelled")  # never seen: the consumer cancelled us
        if isinstance(item, Exception):
            raise item
        if isinstance(item, float):
            await asyncio.sleep(item)
            return await self.read()
        return item

    def cancel(self):
        self.cancelled.set()


class FakeWorkers:
    def __init__(self, script):
        self.script = script
        self.calls: list[tuple[str, worker_pb2.GenerateRequest, FakeCall]] = []

    def generate(self, address, request):
        call = FakeCall(self.script)
        self.calls.append((address, request, call))
        return StreamPump(call.read, call.cancel)


def msg(ids=(), finish=0, cached=0, prompt=0, logprobs=()):
    return worker_pb2.GenerateResponse(token_ids=list(ids), finish_reason=finish, cached_tokens=cached,
                                       prompt_tokens=prompt, logprobs=list(logprobs))


@pytest.fixture(scope="module")
def tokenizers(demo_model_dir):
    cache = TokenizerCache()
    cache.load(str(demo_model_dir))
    return cache


@pytest.fixture
def postprocessor(tokenizers):
    """Builds a Postprocessor over a scripted fake worker, sharing one loaded tokenizer."""
    def make(workers):
        return Postprocessor(workers, tokenizers)
    return make


@pytest.fixture
def make_request(demo_model_dir, tokenizer):
    def make(stop=(), logprobs=None, min_tokens=None):
        req = postprocessor_pb2.GenerateRequest(worker_address="fake:1")
        req.options.model_dir = str(demo_model_dir)
        req.request.request_id = "r1"
        req.request.token_ids.extend(tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False).ids)
        req.request.stop.stop.extend(stop)
        req.request.stop.stop_token_ids_hidden.extend(EOS_TOKEN_IDS)
        if min_tokens is not None:
            req.request.stop.min_tokens = min_tokens
        if logprobs is not None:
            req.request.output.logprobs = logprobs
        return req
    return make


def ids_of(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


async def collect(postprocessor, req):
    return [r async for r in postprocessor.generate(req)]


async def test_buffered_worker_messages_merge_into_one_response(tokenizer, make_request, postprocessor):
    ids = ids_of(tokenizer, "one two three four five six")
    # The fake answers without suspending, so every message is queued before the consumer runs.
    script = [msg(ids[:1], cached=16, prompt=20)] + [msg([i]) for i in ids[1:]] + [msg([EOS_TOKEN_IDS[0]], EOS)]
    workers = FakeWorkers(script)
    responses = await collect(postprocessor(workers), make_request())
    assert len(responses) == 1
    only = responses[0]
    assert (only.text, only.finish_reason, only.completion_tokens) == ("one two three four five six", EOS, len(ids) + 1)
    assert (only.cached_tokens, only.prompt_tokens) == (16, 20)
    address, request, call = workers.calls[0]
    assert address == "fake:1" and request.request.request_id == "r1"


async def test_one_response_per_worker_message_at_most_and_usage_adds_up(tokenizer, make_request, postprocessor):
    ids = ids_of(tokenizer, "alpha beta gamma delta epsilon zeta")
    script = [msg(ids[:2], prompt=5), 0.01, msg(ids[2:4]), 0.01, msg(ids[4:], LENGTH)]
    responses = await collect(postprocessor(FakeWorkers(script)), make_request())
    assert len(responses) == 3
    assert "".join(r.text for r in responses) == "alpha beta gamma delta epsilon zeta"
    assert sum(r.completion_tokens for r in responses) == len(ids)
    assert [r.finish_reason for r in responses] == [0, 0, LENGTH]
    assert responses[0].prompt_tokens == 5


async def test_held_back_tokens_are_carried_into_the_next_response(tokenizer, make_request, postprocessor):
    ids = ids_of(tokenizer, "hi 🤖 ok")
    emoji_end = len(ids_of(tokenizer, "hi 🤖"))
    script = [msg(ids[:1])] + [0.005, msg(ids[1:emoji_end - 1])] + [0.005, msg(ids[emoji_end - 1:], LENGTH)]
    responses = await collect(postprocessor(FakeWorkers(script)), make_request())
    # The middle message held only part of the emoji: no empty response was sent for it.
    assert [r.text for r in responses] == ["hi", " 🤖 ok"]
    assert sum(r.completion_tokens for r in responses) == len(ids)


async def test_stop_string_cancels_the_worker(tokenizer, make_request, postprocessor):
    ids = ids_of(tokenizer, "fine. STOP here")
    workers = FakeWorkers([msg(ids), None])
    responses = await collect(postprocessor(workers), make_request(stop=["STOP"]))
    assert [(r.text, r.finish_reason, r.stop_reason) for r in responses] == [("fine. ", STOP, "STOP")]
    await asyncio.wait_for(workers.calls[0][2].cancelled.wait(), 2)


async def test_logprobs_become_token_texts(tokenizer, make_request, postprocessor):
    ids = ids_of(tokenizer, "Hi there") + [EOS_TOKEN_IDS[0]]
    lps = [common_pb2.TokenLogprob(token_id=i, logprob=-0.5, top=[common_pb2.TopLogprob(token_id=ids[0], logprob=-1)])
           for i in ids]
    responses = await collect(postprocessor(FakeWorkers([msg(ids, EOS, logprobs=lps)])), make_request(logprobs=1))
    tokens = [t.token for r in responses for t in r.logprobs]
    assert tokens == ["Hi", " there", "<|im_end|>"]
    assert responses[0].logprobs[0].top[0].token == "Hi"


async def test_worker_failure_before_tokens_raises_worker_failed(make_request, postprocessor):
    with pytest.raises(WorkerFailed):
        await collect(postprocessor(FakeWorkers([ConnectionResetError("boom")])), make_request())


async def test_worker_failure_after_tokens_raises_after_sending_them(tokenizer, make_request, postprocessor):
    postprocessor = postprocessor(FakeWorkers([msg(ids_of(tokenizer, "partial")), 0.01, WorkerFailed("gone")]))
    seen = []
    with pytest.raises(WorkerFailed):
        async for r in postprocessor.generate(make_request()):
            seen.append(r.text)
    assert seen == ["partial"]


async def test_stream_that_ends_without_finish_is_a_worker_failure(tokenizer, make_request, postprocessor):
    with pytest.raises(WorkerFailed):
        await collect(postprocessor(FakeWorkers([msg(ids_of(tokenizer, "x"))])), make_request())


async def test_closing_the_generator_cancels_the_worker(tokenizer, make_request, postprocessor):
    workers = FakeWorkers([msg(ids_of(tokenizer, "first")), None])
    gen = postprocessor(workers).generate(make_request())
    assert (await anext(gen)).text == "first"
    await gen.aclose()
    assert workers.calls[0][2].cancelled.is_set()


async def test_cancelling_the_consumer_task_cancels_the_worker(tokenizer, make_request, postprocessor):
    workers = FakeWorkers([msg(ids_of(tokenizer, "first")), None])
    first = asyncio.Event()

    async def consume():
        async for _ in postprocessor(workers).generate(make_request()):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert workers.calls[0][2].cancelled.is_set()


async def test_requests_without_address_or_model_dir_are_invalid(make_request, postprocessor):
    req = make_request()
    req.worker_address = ""
    with pytest.raises(InvalidRequest):
        await collect(postprocessor(FakeWorkers([])), req)
    req = make_request()
    req.options.model_dir = ""
    with pytest.raises(InvalidRequest):
        await collect(postprocessor(FakeWorkers([])), req)


# The idle watch (idle_watch.py): a worker silent after its first tokens fails over; a slow consumer never counts.

async def test_a_worker_silent_after_its_first_tokens_fails_within_the_idle_timeout(
        tokenizers, tokenizer, make_request):
    ids = ids_of(tokenizer, "one two")
    workers = FakeWorkers([msg(ids[:1], prompt=3), None])  # None: silent until cancelled
    post = Postprocessor(workers, tokenizers, idle_timeout_s=0.2)
    got = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(WorkerFailed, match="stopped responding"):
        async for response in post.generate(make_request()):
            got.append(response.text)
    waited = loop.time() - started
    assert got == ["one"]
    assert 0.2 <= waited < 1.0  # 1.25 x the timeout at most, plus scheduling
    _, _, call = workers.calls[0]
    assert call.cancelled.is_set()  # the frozen worker's sequence is cancelled, not left running
    await post.close()


async def test_a_slow_consumer_is_not_mistaken_for_a_silent_worker(tokenizers, tokenizer, make_request):
    ids = ids_of(tokenizer, "one two three")
    script = [msg(ids[:1], prompt=3), msg(ids[1:2]), msg(ids[2:]), msg([EOS_TOKEN_IDS[0]], EOS)]
    post = Postprocessor(FakeWorkers(script), tokenizers, idle_timeout_s=0.2)
    texts = []
    async for response in post.generate(make_request()):
        texts.append(response.text)
        await asyncio.sleep(0.5)  # the caller holds each response longer than the idle timeout
    assert "".join(texts) == "one two three"
    await post.close()
