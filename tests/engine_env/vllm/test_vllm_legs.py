"""VllmEngine's legs of a disaggregated request, around a stand-in for AsyncLLM that streams vLLM 0.32's own
RequestOutput/CompletionOutput objects (no engine started; tests/engine/test_vllm_disagg.py runs real ones).

    .venv-vllm/bin/python -m pytest tests/engine_env/vllm -o addopts="--import-mode=importlib"
"""

from __future__ import annotations

import asyncio

import pytest
from vllm.outputs import CompletionOutput, RequestOutput

from services.workers.engine import EngineError, EngineRequest, FinishReason, KvTransferFailed
from services.workers.vllm.engine import VllmEngine

# What vLLM's NixlConnector returns from a finished prefill (nixl/pull_scheduler.py request_finished).
NIXL_RETURNED = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[3, 4]],
                 "remote_engine_id": "e-1", "remote_request_id": "r-1", "remote_host": "10.0.0.2",
                 "remote_port": 5600, "tp_size": 1, "remote_num_tokens": 5}


class FakeAsyncLLM:
    """``AsyncLLM.generate`` as it streams DELTA outputs: one RequestOutput per step, the last finished."""

    def __init__(self, steps: list[tuple[list[int], str | None]], returned: dict | None = None):
        self.steps, self.returned = steps, returned
        self.params: list = []

    async def generate(self, prompt, params, request_id, lora_request=None, data_parallel_rank=None):
        self.params.append(params)
        for ids, reason in self.steps:
            await asyncio.sleep(0)
            finished = reason is not None
            yield RequestOutput(request_id, None, prompt["prompt_token_ids"], None,
                                [CompletionOutput(0, "", ids, None, None, finish_reason=reason)], finished,
                                num_cached_tokens=0, kv_transfer_params=self.returned if finished else None)


def engine_with(llm: FakeAsyncLLM) -> VllmEngine:
    engine = VllmEngine(engine_args=None)
    engine._llm = llm  # what start() sets

    class Config:
        max_model_len = 100

    llm.model_config = Config()
    return engine


async def collect(engine: VllmEngine, request: EngineRequest):
    return [out async for out in engine.generate(request)]


async def test_a_prefill_leg_returns_the_connectors_params_on_its_last_output_only():
    llm = FakeAsyncLLM([([7], "length")], returned=NIXL_RETURNED)
    outs = await collect(engine_with(llm), EngineRequest("r", [1, 2, 3, 4, 5], max_tokens=9,
                                                         kv_transfer_params={"do_remote_decode": True}))
    assert outs[-1].kv_transfer_params == NIXL_RETURNED and outs[-1].finish_reason == FinishReason.LENGTH
    sent = llm.params[0]
    assert sent.max_tokens == 1 and sent.extra_args == {"kv_transfer_params": {"do_remote_decode": True}}


async def test_a_prefill_leg_on_a_content_addressed_connector_returns_an_empty_object():
    llm = FakeAsyncLLM([([7], "length")], returned=None)  # vLLM's ExampleConnector returns nothing
    outs = await collect(engine_with(llm), EngineRequest("r", [1, 2, 3], kv_transfer_params={"do_remote_decode": True}))
    assert outs[-1].kv_transfer_params == {}


async def test_an_ordinary_request_and_a_decode_leg_return_no_params():
    for params in (None, NIXL_RETURNED):
        llm = FakeAsyncLLM([([7], None), ([8], "length")], returned={"do_remote_decode": True})
        outs = await collect(engine_with(llm), EngineRequest("r", [1, 2, 3], max_tokens=2, kv_transfer_params=params))
        assert [o.kv_transfer_params for o in outs] == [None, None]


async def test_a_decode_leg_vllm_could_not_load_is_a_failed_transfer():
    llm = FakeAsyncLLM([([], "error")])
    with pytest.raises(KvTransferFailed):
        await collect(engine_with(llm), EngineRequest("r", [1, 2, 3], kv_transfer_params=NIXL_RETURNED))
    assert llm.params[0].extra_args == {"kv_transfer_params": NIXL_RETURNED}


async def test_an_error_finish_elsewhere_stays_an_engine_failure():
    llm = FakeAsyncLLM([([], "error")])
    with pytest.raises(EngineError) as raised:
        await collect(engine_with(llm), EngineRequest("r", [1, 2, 3]))
    assert not isinstance(raised.value, KvTransferFailed)
