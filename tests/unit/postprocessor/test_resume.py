"""Resuming a sequence that another postprocessor replica was running (``GenerateRequest.resume``).

A worker that continues a prompt exactly (as the mocker's pseudo-random mode and any greedy engine do)
stands behind the postprocessor. The sequence runs once undisturbed; then, for every response it could
have been cut after, the ids of the responses before the cut are resumed on a fresh ``Postprocessor``:
what the caller sees in all (text, reasoning, tool calls, usage, finish) must equal the undisturbed run,
with stop-string hold-back, a split emoji and the reasoning and tool-call parsers all mid-way at a cut.
"""

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

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

TOOLS = '[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]'
PLAIN = "Then the enigma, 🤖 the en-route ones, the 🤖🤖 en route, then the end. Then more"
PARSED = ('<think>Paris? the 🤖 thinks</think>Let me check. <tool_call>\n{"name": "get_weather", '
          '"arguments": {"city": "Paris 🤖"}}\n</tool_call>')
CHUNKS = (1, 2, 1, 3)  # worker message sizes, repeated: responses end at varied places


class ContinuingWorkers:
    """A worker that answers ``answer`` to ``prompt`` and continues it exactly when the prompt already holds
    part of it; messages of ``CHUNKS`` sizes, one per read, the last one with ``finish``."""

    def __init__(self, prompt: list[int], answer: list[int], finish: int):
        self._prompt, self._answer, self._finish = prompt, answer, finish
        self.requests: list[worker_pb2.GenerateRequest] = []

    def generate(self, address, request):
        self.requests.append(request)
        ids = list(request.request.token_ids)
        assert ids[:len(self._prompt)] == self._prompt
        done = len(ids) - len(self._prompt)
        assert ids[len(self._prompt):] == self._answer[:done], "the continuation is not the answer so far"
        # Message boundaries at the same places of the answer either way: a stop string's message counts whole.
        ends, at, k = [], 0, 0
        while at < len(self._answer):
            at = min(at + CHUNKS[k % len(CHUNKS)], len(self._answer))
            k += 1
            ends.append(at)
        messages, at = [], done
        for end in (e for e in ends if e > done):
            messages.append(worker_pb2.GenerateResponse(token_ids=self._answer[at:end], prompt_tokens=len(ids),
                                                        finish_reason=self._finish if end == ends[-1] else 0))
            at = end
        script = iter(messages)

        async def read():
            await asyncio.sleep(0.001)  # one message per read: each may become a response
            return next(script, None)
        return StreamPump(read, lambda: None)


@pytest.fixture(scope="module")
def tokenizers(demo_model_dir):
    cache = TokenizerCache()
    cache.load(str(demo_model_dir))
    return cache


def request(demo_model_dir, tokenizer, parsed: bool) -> postprocessor_pb2.GenerateRequest:
    req = postprocessor_pb2.GenerateRequest(worker_address="fake:1", worker_id="w1")
    req.options.model_dir = str(demo_model_dir)
    req.request.request_id = "r1"
    req.request.token_ids.extend(tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False).ids)
    req.request.stop.stop_token_ids_hidden.extend(EOS_TOKEN_IDS)
    req.request.stop.max_tokens = 200
    if parsed:
        req.options.reasoning_parser = "qwen3"
        req.options.tool_call_parser = "hermes"
        req.options.tools_json = TOOLS
    else:
        req.request.stop.stop.extend(["the end", "🤖🤖 end"])  # held back at "the en" and at each 🤖
    return req


def seen(responses: list[postprocessor_pb2.GenerateResponse]) -> dict:
    """What a caller makes of a response stream: every field summed up the way the gateway does."""
    calls: dict[int, list[str]] = {}
    for r in responses:
        for c in r.tool_calls:
            calls.setdefault(c.index, ["", "", ""])
            calls[c.index][0] += c.id[:5]  # "call_": the rest is random per call
            calls[c.index][1] += c.name
            calls[c.index][2] += c.arguments
    return {"text": "".join(r.text for r in responses), "reasoning": "".join(r.reasoning_text for r in responses),
            "tool_calls": calls, "completion_tokens": sum(r.completion_tokens for r in responses),
            "prompt_tokens": sum(r.prompt_tokens for r in responses), "finish": responses[-1].finish_reason,
            "stop_reason": responses[-1].stop_reason, "finishes": sum(bool(r.finish_reason) for r in responses)}


async def collect(postprocessor, req):
    return [r async for r in postprocessor.generate(req)]


@pytest.mark.parametrize("parsed", [False, True], ids=["stop-strings", "reasoning-and-tool-calls"])
async def test_a_resumed_sequence_reads_as_the_undisturbed_one_wherever_it_was_cut(
        demo_model_dir, tokenizer, tokenizers, parsed):
    req = request(demo_model_dir, tokenizer, parsed)
    prompt = list(req.request.token_ids)
    text = PARSED if parsed else PLAIN
    answer = [*tokenizer.encode(text, add_special_tokens=False).ids, EOS_TOKEN_IDS[0]]
    workers = ContinuingWorkers(prompt, answer, common_pb2.FINISH_REASON_EOS)
    reference = await collect(Postprocessor(workers, tokenizers), req)
    want = seen(reference)
    assert want["finish"] == (common_pb2.FINISH_REASON_TOOL_CALLS if parsed else common_pb2.FINISH_REASON_STOP)
    assert want["tool_calls"] if parsed else want["stop_reason"] == "the end"
    # Every response names the ids it accounts for, and together they are every id the decoder took in.
    consumed = [i for r in reference for i in r.token_ids]
    assert consumed == answer[:len(consumed)] and len(consumed) == want["completion_tokens"]
    assert len(reference) > 6

    for cut in range(1, len(reference)):
        delivered = reference[:cut]
        resumed = postprocessor_pb2.GenerateRequest()
        resumed.CopyFrom(req)
        resumed.resume.token_ids.extend(i for r in delivered for i in r.token_ids)
        workers.requests.clear()
        rest = await collect(Postprocessor(workers, tokenizers), resumed)
        assert seen(delivered + rest) == want, f"cut after response {cut}"
        # The worker continued the sequence (not started it over), with the budget it had left.
        (continued,) = workers.requests
        ids = list(resumed.resume.token_ids)
        assert list(continued.request.token_ids) == prompt + ids
        assert continued.request.stop.max_tokens == 200 - len(ids)
        assert not rest[0].worker_id  # the same worker: nothing moved


async def test_ids_that_would_have_ended_the_sequence_are_refused(demo_model_dir, tokenizer, tokenizers):
    req = request(demo_model_dir, tokenizer, parsed=False)
    answer = [*tokenizer.encode("hello", add_special_tokens=False).ids, EOS_TOKEN_IDS[0]]
    workers = ContinuingWorkers(list(req.request.token_ids), answer, common_pb2.FINISH_REASON_EOS)
    req.resume.token_ids.extend(answer)  # the hidden EOS ends it: no replica sent these without a finish
    with pytest.raises(InvalidRequest, match="resume.token_ids"):
        await collect(Postprocessor(workers, tokenizers), req)
    assert not workers.requests


async def test_a_guided_sequence_with_tokens_is_not_resumed(demo_model_dir, tokenizer, tokenizers):
    # Its grammar state died with the worker's sequence; a continuation would restart the grammar mid-answer.
    req = request(demo_model_dir, tokenizer, parsed=False)
    req.request.sampling.guided_decoding.json_schema = '{"type": "object"}'
    answer = tokenizer.encode('{"a": 1}', add_special_tokens=False).ids
    workers = ContinuingWorkers(list(req.request.token_ids), answer, common_pb2.FINISH_REASON_EOS)
    req.resume.token_ids.extend(answer[:2])
    with pytest.raises(WorkerFailed, match="guided decoding cannot resume"):
        await collect(Postprocessor(workers, tokenizers), req)
    assert not workers.requests
