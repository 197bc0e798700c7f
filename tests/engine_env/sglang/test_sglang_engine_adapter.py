"""SglangEngine's stream handling, around a stand-in for sglang.Engine that behaves as 0.5.23's does.

The stand-in streams what SGLang's TokenizerManager streams in its default mode: cumulative
``output_ids`` and logprob lists (the same growing list objects from one output to the next), a
``finish_reason`` on the last, and on close or cancel it aborts the request, as
``TokenizerManager.generate_request`` does. Its requests are built with SGLang's own
``GenerateReqInput``, so a wrong keyword fails here too.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.load_snapshot import LoadSnapshot

from services.workers.engine import (
    EngineBusy,
    EngineError,
    EngineRequest,
    FinishReason,
    KvTransferFailed,
    RequestRejected,
    TokenLogprob,
)
from services.workers.sglang import sampling
from services.workers.sglang.engine import SglangEngine

PROMPT = (1, 2, 3, 4, 5)
EOS = 99


class FakeReader:
    def __init__(self, snapshots):
        self.snapshots = snapshots

    def read_all(self):
        return self.snapshots


class FakeTokenizerManager:
    def __init__(self):
        self.aborted: list[str] = []
        self.load_snapshot_reader = FakeReader([])

    def abort_request(self, rid: str = "", abort_all: bool = False):
        self.aborted.append(rid)


class FakeEngine:
    """``async_generate(stream=True)`` as SGLang answers it; ``script`` is a list of steps per request:
    ("tokens", [ids], cached) | ("finish", reason) | ("wait",) | ("raise", exc)."""

    def __init__(self, script, *, logprobs=False):
        self.tokenizer_manager = FakeTokenizerManager()
        self.script = script
        self.requests: list[GenerateReqInput] = []
        self.released = asyncio.Event()
        self.exits: list[str] = []

    async def async_generate(self, **kwargs):
        obj = GenerateReqInput(**kwargs)
        obj.normalize_batch_and_arguments()
        self.requests.append(obj)
        return self._stream(obj)

    async def _stream(self, obj):
        ids: list[int] = []
        token_lps: list = []
        top_lps: list = []
        meta = {"id": obj.rid, "prompt_tokens": len(obj.input_ids), "cached_tokens": 0}
        finished = False
        try:
            for step in self.script:
                if step[0] == "wait":
                    await self.released.wait()
                    continue
                if step[0] == "raise":
                    raise step[1]
                if step[0] == "tokens":
                    ids.extend(step[1])
                    token_lps.extend((-0.5, t, None) for t in step[1])
                    top_lps.extend([(-0.5, t, None), (-1.5, 7, None)] for t in step[1])
                    meta = {**meta, "cached_tokens": step[2], "finish_reason": None}
                    if obj.return_logprob:
                        meta.update(output_token_logprobs=token_lps, output_top_logprobs=top_lps)
                    yield {"output_ids": ids, "meta_info": meta}  # SGLang's own growing lists
                    continue
                finished = True  # SGLang forgets a finished request before handing out its last output
                yield {"output_ids": ids, "meta_info": {**meta, "finish_reason": step[1]}}
                return
        except BaseException as e:  # GeneratorExit or CancelledError: SGLang aborts an unfinished request
            self.exits.append(type(e).__name__)
            if not finished:
                self.tokenizer_manager.abort_request(obj.rid)
            raise


async def started(script) -> tuple[SglangEngine, FakeEngine]:
    engine = SglangEngine(server_args=None, reasoning_parser="")
    fake = FakeEngine(script)
    # What start() reads from a real engine.
    engine._engine = fake
    engine._limits = sampling.EngineLimits(max_model_len=64)
    engine._death = asyncio.get_running_loop().create_future()
    engine._block_size, engine._total_tokens, engine._batched_tokens = 16, 1600, 8192
    return engine, fake


def request(**kw) -> EngineRequest:
    return EngineRequest("req", PROMPT, eos_token_ids=(EOS,), **kw)


async def collect(engine, req):
    return [out async for out in engine.generate(req)]


async def test_cumulative_outputs_become_deltas_and_the_first_reports_the_prompt():
    engine, fake = await started([("tokens", [10], 3), ("tokens", [11, 12], 3), ("tokens", [EOS], 3),
                                  ("finish", {"type": "stop", "matched": EOS})])
    outs = await collect(engine, request())
    assert [o.token_ids for o in outs] == [[10], [11, 12], [EOS], []]
    assert [o.finish_reason for o in outs] == [FinishReason.NONE] * 3 + [FinishReason.EOS]
    assert (outs[0].prompt_tokens, outs[0].cached_tokens) == (5, 3)
    assert all(o.prompt_tokens is None for o in outs[1:])
    assert fake.requests[0].sampling_params["max_new_tokens"] == 64 - 5
    assert fake.requests[0].rid.startswith("req-")
    assert fake.tokenizer_manager.aborted == []  # finished: nothing to abort


async def test_logprobs_follow_their_tokens():
    engine, _ = await started([("tokens", [10, 11], 0), ("finish", {"type": "length", "length": 2})])
    outs = await collect(engine, request(logprobs=1))
    assert outs[0].logprobs == [TokenLogprob(10, -0.5, ((10, -0.5),)), TokenLogprob(11, -0.5, ((11, -0.5),))]
    assert outs[-1].finish_reason == FinishReason.LENGTH


async def test_outputs_that_queued_while_the_consumer_was_busy_come_as_one():
    engine, _ = await started([("tokens", [10], 0), ("tokens", [11], 0), ("tokens", [12], 0),
                               ("finish", {"type": "length", "length": 3})])
    stream = engine.generate(request())
    first = await anext(stream)
    rest = [o async for o in stream]
    assert first.token_ids == [10]
    assert [t for o in rest for t in o.token_ids] == [11, 12]  # nothing twice, nothing lost


async def test_the_same_rid_is_never_sent_twice():
    engine, fake = await started([("finish", {"type": "length", "length": 0})])
    await collect(engine, request())
    await collect(engine, request())
    assert len({r.rid for r in fake.requests}) == 2


async def test_closing_the_stream_aborts_the_request():
    engine, fake = await started([("tokens", [10], 0), ("wait",), ("tokens", [11], 0)])
    stream = engine.generate(request())
    assert (await anext(stream)).token_ids == [10]
    await stream.aclose()
    rid = fake.requests[0].rid
    assert fake.exits == ["GeneratorExit"]
    assert fake.tokenizer_manager.aborted == [rid, rid]  # SGLang's own cleanup, then ours (a no-op in SGLang)
    assert engine.in_flight == 0


async def test_cancelling_a_waiting_consumer_aborts_the_request_at_once():
    engine, fake = await started([("tokens", [10], 0), ("wait",), ("tokens", [11], 0)])

    async def consume():
        async with contextlib.aclosing(engine.generate(request())) as stream:
            async for _ in stream:
                pass

    task = asyncio.create_task(consume())
    while not fake.requests:
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.exits == ["CancelledError"]
    assert fake.tokenizer_manager.aborted[0] == fake.requests[0].rid
    assert engine.in_flight == 0


async def test_the_engines_death_fails_open_streams_at_once_and_resolves_failed():
    engine, fake = await started([("tokens", [10], 0), ("wait",)])
    watcher = asyncio.create_task(engine.failed())
    stream = engine.generate(request())
    await anext(stream)
    asyncio.get_running_loop().call_later(0.05, engine._child_failed)  # SIGQUIT from a crashed child
    with pytest.raises(EngineError, match="died"):
        await asyncio.wait_for(anext(stream), 2)
    assert isinstance(await asyncio.wait_for(watcher, 1), EngineError)
    assert fake.tokenizer_manager.aborted == [fake.requests[0].rid]  # SGLang's cleanup only: nobody to tell
    with pytest.raises(EngineError, match="died"):
        await collect(engine, request())  # a new request fails too


async def test_a_cancelled_death_watcher_leaves_the_death_watch_intact():
    engine, _ = await started([("finish", {"type": "length", "length": 0})])
    watcher = asyncio.create_task(engine.failed())
    await asyncio.sleep(0)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    assert not engine._death.done()
    assert [o.finish_reason for o in await collect(engine, request())] == [FinishReason.LENGTH]


@pytest.mark.parametrize(("status", "error"), [(400, RequestRejected), (503, EngineBusy), (500, EngineError)])
async def test_aborts_sglang_decided_are_errors(status, error):
    engine, _ = await started([("finish", {"type": "abort", "message": "no", "status_code": status,
                                           "err_type": None})])
    with pytest.raises(error) as raised:
        await collect(engine, request())
    assert type(raised.value) is error


async def test_a_plain_abort_is_a_cancelled_finish():
    engine, _ = await started([("tokens", [10], 0), ("finish", {"type": "abort", "message": "Abort in waiting queue"})])
    outs = await collect(engine, request())
    assert [o.finish_reason for o in outs] == [FinishReason.NONE, FinishReason.CANCELLED]


async def test_sglangs_validation_errors_are_rejections():
    engine, _ = await started([("raise", ValueError("The input (70 tokens) is longer than the model's context"))])
    with pytest.raises(RequestRejected, match="longer than"):
        await collect(engine, request())


async def test_refusals_of_the_mapping_reach_the_caller_before_sglang_sees_anything():
    engine, fake = await started([("finish", {"type": "length", "length": 0})])
    with pytest.raises(RequestRejected, match="ignore_eos"):
        await collect(engine, EngineRequest("r", PROMPT, stop_token_ids=(5,), ignore_eos=True))
    assert fake.requests == []


async def test_a_stream_without_a_finish_is_an_engine_error():
    engine, _ = await started([("tokens", [10], 0)])
    with pytest.raises(EngineError, match="without a finish"):
        await collect(engine, request())


async def test_load_comes_from_sglangs_load_snapshots():
    engine, fake = await started([("tokens", [10], 0), ("wait",)])
    fake.tokenizer_manager.load_snapshot_reader = FakeReader([
        LoadSnapshot(dp_rank=0, num_running_reqs=3, num_waiting_reqs=2, num_used_tokens=33),
        LoadSnapshot(dp_rank=1, num_running_reqs=1, num_waiting_reqs=0, num_used_tokens=15)])
    assert engine.read_load() == {"active_blocks": 0, "waiting": 0, "running": 0, "total_blocks": 100}  # idle
    stream = engine.generate(request())
    await anext(stream)
    assert engine.read_load() == {"active_blocks": 4, "waiting": 2, "running": 4, "total_blocks": 100}
    await stream.aclose()


# -- data-parallel ranks ---------------------------------------------------------------------------------


async def test_a_request_runs_on_the_rank_the_router_chose():
    engine, fake = await started([("tokens", [10], 0), ("finish", {"type": "length", "length": 1})])
    engine.dp_size = 2  # what start() reads from a --dp-size 2 engine
    await collect(engine, request(dp_rank=1))
    await collect(engine, request())  # no rank: SGLang's own balancing places it
    assert [r.routed_dp_rank for r in fake.requests] == [1, None]


async def test_a_rank_the_worker_lacks_is_refused_naming_dp_rank_before_sglang_sees_it():
    engine, fake = await started([("tokens", [10], 0), ("finish", {"type": "length", "length": 1})])
    engine.dp_size = 2
    with pytest.raises(RequestRejected, match="no data-parallel rank 2") as e:
        await collect(engine, request(dp_rank=2))
    assert e.value.param == "dp_rank" and fake.requests == [] and engine.in_flight == 0


async def test_a_worker_without_ranks_sends_sglang_no_rank():
    engine, fake = await started([("tokens", [10], 0), ("finish", {"type": "length", "length": 1})])
    await collect(engine, request(dp_rank=0))
    assert fake.requests[0].routed_dp_rank is None


async def test_each_ranks_load_is_its_own_snapshot_and_an_idle_rank_reports_none():
    engine, fake = await started([("tokens", [10], 0), ("wait",)])
    engine.dp_size = 2
    fake.tokenizer_manager.load_snapshot_reader = FakeReader([
        LoadSnapshot(dp_rank=0, num_running_reqs=3, num_waiting_reqs=2, num_used_tokens=33),
        LoadSnapshot(dp_rank=1, num_running_reqs=1, num_waiting_reqs=1, num_used_tokens=15)])
    idle = {"active_blocks": 0, "waiting": 0, "running": 0, "total_blocks": 100}
    stream = engine.generate(request(dp_rank=1))
    await anext(stream)
    assert engine.read_load(1) == {"active_blocks": 1, "waiting": 1, "running": 1, "total_blocks": 100}
    assert engine.read_load(0) == idle  # nothing of this worker's runs there: its last snapshot is stale
    await stream.aclose()
    assert engine.read_load(1) == idle
    unplaced = engine.generate(request())  # placed by SGLang: any rank may be busy with it
    await anext(unplaced)
    assert engine.read_load(0)["running"] == 3 and engine.read_load(1)["running"] == 1
    await unplaced.aclose()


# -- disaggregation --------------------------------------------------------------------------------------


async def test_a_prefill_leg_names_the_bootstrap_server_and_returns_it_on_its_last_output():
    engine, fake = await started([("tokens", [10], 0), ("finish", {"type": "length", "length": 1})])
    engine.bootstrap_host, engine._bootstrap_port = "10.0.0.5", 8998
    outs = await collect(engine, request(max_tokens=1, kv_transfer_params={"do_remote_decode": True}))
    sent = fake.requests[0]
    assert (sent.bootstrap_host, sent.bootstrap_port) == ("10.0.0.5", 8998) and 0 <= sent.bootstrap_room < 2**63
    returned = {"do_remote_prefill": True, "bootstrap_host": "10.0.0.5", "bootstrap_port": 8998,
                "bootstrap_room": sent.bootstrap_room}
    # Announced first, with no tokens (the postprocessor opens the decode leg on it: the paired order), then
    # the tokens, the prompt's usage on the first of them, and the same parameters on the last output.
    assert outs[0].token_ids == [] and outs[0].kv_transfer_params == returned and outs[0].prompt_tokens is None
    assert [o.kv_transfer_params for o in outs[1:-1]] == [None] * (len(outs) - 2)
    assert outs[1].prompt_tokens == len(PROMPT) and outs[-1].kv_transfer_params == returned


async def test_the_prefill_leg_announces_its_bootstrap_before_sglang_sees_the_request():
    """SGLang's prefill server produces nothing until the decode server connected: the announcement cannot wait
    for SGLang's first output."""
    engine, fake = await started([("wait",)])
    engine.bootstrap_host, engine._bootstrap_port = "10.0.0.5", 8998
    stream = engine.generate(request(max_tokens=1, kv_transfer_params={"do_remote_decode": True}))
    announced = await asyncio.wait_for(anext(stream), 1)
    assert announced.kv_transfer_params is not None and fake.requests == []
    await stream.aclose()


async def test_a_decode_leg_meets_its_prefill_worker_in_the_room_it_returned():
    engine, fake = await started([("tokens", [11, 12], 0), ("finish", {"type": "length", "length": 2})])
    returned = {"do_remote_prefill": True, "bootstrap_host": "10.0.0.5", "bootstrap_port": 8998, "bootstrap_room": 77}
    outs = await collect(engine, request(max_tokens=2, kv_transfer_params=returned))
    sent = fake.requests[0]
    assert (sent.bootstrap_host, sent.bootstrap_port, sent.bootstrap_room) == ("10.0.0.5", 8998, 77)
    assert all(o.kv_transfer_params is None for o in outs)


async def test_a_decode_leg_sglang_cannot_resolve_fails_before_reaching_sglang():
    engine, fake = await started([("finish", {"type": "length", "length": 0})])
    with pytest.raises(KvTransferFailed, match="bootstrap_room"):
        await collect(engine, request(kv_transfer_params={"do_remote_prefill": True, "bootstrap_host": "h",
                                                          "bootstrap_port": 8998}))
    assert fake.requests == [] and engine.in_flight == 0
