"""The mocker's disaggregated legs (services/workers/mocker/transfer.py): a prefill leg holds its blocks, a decode
leg pulls them (freeing them on the prefill side), waits out the transfer time and decodes with them cached."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import InvalidRequest, WorkerFailed
from services.workers import convert
from services.workers.engine import EngineOutput, EngineRequest, FinishReason, KvTransferFailed, SamplingParams
from services.workers.mocker.config import MockerEngineConfig
from services.workers.mocker.engine import MockerEngine
from services.workers.mocker.outputs import OutputPolicy
from services.workers.mocker.sequence import full_blocks
from services.workers.mocker.transfer import (
    DO_REMOTE_DECODE,
    REMOTE_HANDLE,
    PulledKv,
    RemotePrefill,
    TransferSettings,
    transfer_metrics,
)

pytestmark = pytest.mark.unit

EOS = (151645, 151643)
PROMPT = list(range(100, 170))  # 70 tokens: 4 full blocks of 16 and a tail of 6
REMOTE_DECODE = {DO_REMOTE_DECODE: True}


class LocalPuller:
    """The decode side's puller, reaching prefill engines in this process (the gRPC one is in transfer_grpc.py)."""

    def __init__(self, engines: dict[str, MockerEngine]):
        self.engines = engines
        self.gate: asyncio.Event | None = None  # set: pulls wait for it (a slow network)

    async def pull(self, source: RemotePrefill) -> PulledKv:
        if self.gate is not None:
            await self.gate.wait()
        engine = self.engines.get(source.worker_id)
        if engine is None:
            raise KvTransferFailed(f"prefill worker {source.worker_id} cannot be reached")
        try:
            return engine.holds.pull(source.worker_id, source.handle)
        except KeyError:
            raise KvTransferFailed("no such KV blocks") from None


@pytest.fixture
async def pair(clock, tokenizer, listener):
    """A prefill engine and a decode engine that pulls from it; nothing may leak once both close."""
    policy = OutputPolicy.build(tokenizer)
    engines: dict[str, MockerEngine] = {}
    puller = LocalPuller(engines)

    def make(**cfg) -> MockerEngine:
        cfg.setdefault("speedup_ratio", 1.0)
        return MockerEngine(MockerEngineConfig(**cfg), policy, eos_token_ids=EOS, clock=clock, puller=puller,
                            listener=listener if engines else None)

    prefill = engines["prefill-1"] = make(kv_hold_timeout_s=0)
    prefill.holds.identify("prefill-1", "127.0.0.1:1")
    decode = make()
    yield prefill, decode, puller
    for engine in (prefill, decode):
        await engine.close()
        assert engine.cache.active_blocks == 0
        assert not engine.scheduler.has_work()


async def run(engine: MockerEngine, request: EngineRequest):
    outputs = [out async for out in engine.generate(request)]
    return outputs, [t for out in outputs for t in out.token_ids]


def req(prompt, rid="r", **kw) -> EngineRequest:
    kw.setdefault("sampling", SamplingParams(seed=7))
    return EngineRequest(rid, list(prompt), **kw)


def count(outcome: str) -> float:
    return transfer_metrics()[0].labels(outcome)._value.get()


async def test_prefill_leg_emits_one_token_and_holds_its_blocks_until_pulled(pair):
    prefill, _, _ = pair
    outputs, tokens = await run(prefill, req(PROMPT, max_tokens=50, kv_transfer_params=REMOTE_DECODE))
    assert len(tokens) == 1 and outputs[-1].finish_reason is FinishReason.LENGTH
    params = outputs[-1].kv_transfer_params
    assert params is not None and params["remote_engine_id"] == "prefill-1"
    assert params["remote_address"] == "127.0.0.1:1" and params["remote_num_tokens"] == len(PROMPT)
    # 4 full prompt blocks plus the private tail (which the first token went into) stay held.
    assert prefill.cache.active_blocks == 5 and prefill.holds.held_blocks == 5
    pulled = prefill.holds.pull("prefill-1", params[REMOTE_HANDLE])
    assert pulled.block_hashes == tuple(b.block_hash for b in full_blocks(PROMPT, 16))
    assert prefill.cache.active_blocks == 0 and len(prefill.holds) == 0  # freed by the pull itself
    with pytest.raises(KeyError):  # a handle is good for one pull
        prefill.holds.pull("prefill-1", params[REMOTE_HANDLE])


async def test_an_ordinary_request_on_the_same_engine_holds_nothing(pair):
    prefill, _, _ = pair
    outputs, tokens = await run(prefill, req(PROMPT, max_tokens=5))
    assert len(tokens) == 5 and outputs[-1].kv_transfer_params is None
    assert prefill.cache.active_blocks == 0


async def test_decode_leg_pulls_waits_the_transfer_and_continues_the_aggregated_tokens(pair, clock, listener):
    prefill, decode, _ = pair
    _, agg = await run(prefill, req(PROMPT, max_tokens=12))
    outputs, first = await run(prefill, req(PROMPT, max_tokens=12, kv_transfer_params=REMOTE_DECODE))
    assert first == agg[:1]
    clock.sleeps.clear()
    listener.events.clear()
    dec_out, rest = await run(decode, req(PROMPT + first, "d", max_tokens=11,
                                         kv_transfer_params=outputs[-1].kv_transfer_params))
    assert first + rest == agg  # token-identical to the aggregated run
    assert prefill.cache.active_blocks == 0  # the pull freed the prefill side
    # The whole prompt came over: the decode worker reports its full blocks cached and computed nothing of it.
    assert dec_out[0].cached_tokens == 64 and dec_out[0].prompt_tokens == len(PROMPT) + 1
    # Its KV events show the transferred blocks, chained from the root, before anything else.
    assert listener.events[0] == ("stored", [b.block_hash for b in full_blocks(PROMPT, 16)], None)
    # The transfer took 4 blocks x 2 MiB at 25 GB/s, and no prefill step ran (a decode step is ~6 ms, a prefill
    # step at least 26 ms).
    assert clock.sleeps[0] == pytest.approx(TransferSettings().seconds(4))
    assert max(clock.sleeps[1:]) < 0.010


async def test_decode_refuses_a_handle_it_cannot_resolve(pair):
    prefill, decode, _ = pair
    outputs, _ = await run(prefill, req(PROMPT, max_tokens=4, kv_transfer_params=REMOTE_DECODE))
    params = dict(outputs[-1].kv_transfer_params)
    refused = count("refused")
    for bad in ({**params, "remote_handle": "stale"}, {**params, "remote_engine_id": "prefill-9"},
                {"do_remote_prefill": True, "remote_engine_id": "prefill-1"}):
        with pytest.raises(KvTransferFailed) as e:
            await run(decode, req(PROMPT, "d", max_tokens=3, kv_transfer_params=bad))
        err = convert.engine_error(e.value)
        assert isinstance(err, WorkerFailed) and err.param == "kv_transfer_params"
    assert count("refused") == refused + 2  # the malformed one never reached a pull
    assert decode.cache.active_blocks == 0
    prefill.holds.release(params["remote_handle"])


async def test_decode_refuses_blocks_of_another_prompt(pair):
    prefill, decode, _ = pair
    outputs, _ = await run(prefill, req(PROMPT, max_tokens=4, kv_transfer_params=REMOTE_DECODE))
    with pytest.raises(KvTransferFailed, match="another prompt"):
        await run(decode, req(list(range(500, 580)), "d", max_tokens=3,
                              kv_transfer_params=outputs[-1].kv_transfer_params))
    assert prefill.cache.active_blocks == 0 and decode.cache.active_blocks == 0


async def test_unpulled_blocks_expire_and_are_counted(clock, tokenizer):
    engine = MockerEngine(MockerEngineConfig(speedup_ratio=0.0, kv_hold_timeout_s=0.05),
                          OutputPolicy.build(tokenizer), clock=clock)
    expired = count("expired")
    try:
        await run(engine, req(PROMPT, max_tokens=4, kv_transfer_params=REMOTE_DECODE))
        assert engine.holds.held_blocks == 5
        for _ in range(100):
            if not engine.holds.held_blocks:
                break
            await asyncio.sleep(0.01)
        assert engine.cache.active_blocks == 0 and count("expired") == expired + 1
    finally:
        await engine.close()


async def test_release_frees_a_hold_once(pair):
    prefill, _, _ = pair
    outputs, _ = await run(prefill, req(PROMPT, max_tokens=4, kv_transfer_params=REMOTE_DECODE))
    handle = outputs[-1].kv_transfer_params[REMOTE_HANDLE]
    assert prefill.holds.release(handle) is True
    assert prefill.cache.active_blocks == 0
    assert prefill.holds.release(handle) is False


async def test_a_prefill_leg_whose_caller_left_before_the_handle_holds_nothing(pair):
    prefill, _, _ = pair
    gen = prefill.generate(req(PROMPT, max_tokens=4, kv_transfer_params=REMOTE_DECODE))
    task = asyncio.ensure_future(gen.__anext__())
    for _ in range(50):  # let the step run, so that the blocks are held, and leave before taking the output
        await asyncio.sleep(0)
        if prefill.holds.held_blocks:
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await gen.aclose()
    assert prefill.holds.held_blocks == 0 and prefill.cache.active_blocks == 0


async def test_cancel_during_the_transfer_frees_both_sides(pair):
    prefill, decode, puller = pair
    outputs, first = await run(prefill, req(PROMPT, max_tokens=6, kv_transfer_params=REMOTE_DECODE))
    params = outputs[-1].kv_transfer_params
    puller.gate = asyncio.Event()
    task = asyncio.ensure_future(run(decode, req(PROMPT + first, "d", max_tokens=5, kv_transfer_params=params)))
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # The caller releases the hold it knows of (the postprocessor does, on a hang-up during the transfer).
    assert prefill.holds.release(params[REMOTE_HANDLE]) is True
    assert prefill.cache.active_blocks == 0 and decode.cache.active_blocks == 0
    assert not decode.scheduler.has_work()


async def test_decode_leg_waiting_for_a_slot_keeps_its_pulled_blocks_until_aborted(pair):
    prefill, decode, _ = pair
    blocker = decode.generate(req(range(2000, 2040), "busy", max_tokens=2000))
    await blocker.__anext__()  # occupies the only slot
    decode.scheduler.limits = type(decode.scheduler.limits)(max_num_seqs=1)
    outputs, first = await run(prefill, req(PROMPT, max_tokens=6, kv_transfer_params=REMOTE_DECODE))
    gen = decode.generate(req(PROMPT + first, "d", max_tokens=5, kv_transfer_params=outputs[-1].kv_transfer_params))
    task = asyncio.ensure_future(gen.__anext__())
    await asyncio.sleep(0.01)
    assert len(decode.scheduler.waiting) == 1 and decode.cache.refcount(full_blocks(PROMPT, 16)[0].block_hash) == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await gen.aclose()
    await blocker.aclose()
    assert decode.cache.active_blocks == 0


def test_each_leg_maps_to_the_engine_as_vllm_s_kv_transfer_params():
    def leg(role, raw=b""):
        r = worker_pb2.GenerateRequest()
        r.request.token_ids.extend([1, 2])
        r.request.disaggregation.role = role
        r.request.disaggregation.kv_transfer_params = raw
        return convert.request_from_proto(r).kv_transfer_params

    assert leg(common_pb2.DISAGGREGATION_ROLE_UNSPECIFIED) is None
    assert leg(common_pb2.DISAGGREGATION_ROLE_PREFILL) == {"do_remote_decode": True}
    assert leg(common_pb2.DISAGGREGATION_ROLE_DECODE, b'{"remote_handle": "h"}') == {"remote_handle": "h"}
    for bad in (b"[1]", b"{nope"):
        with pytest.raises(InvalidRequest) as e:
            leg(common_pb2.DISAGGREGATION_ROLE_DECODE, bad)
        assert e.value.param == "kv_transfer_params"
    out = convert.output_to_proto(EngineOutput([5], FinishReason.LENGTH, kv_transfer_params={"remote_handle": "h"}))
    assert out.kv_transfer_params == b'{"remote_handle":"h"}'
    assert not convert.output_to_proto(EngineOutput([5])).kv_transfer_params
