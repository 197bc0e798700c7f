"""The postprocessor's MuxWorkerClient against a real mocker server: demux, cancel, broken stream, reconnect."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import InvalidRequest, WorkerFailed
from services.postprocessor.mux_client import MuxWorkerClient
from services.postprocessor.service import Postprocessor
from services.workers.mocker.config import parse_config
from services.workers.mocker.main import build_engine
from services.workers.server import build_server

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def generate_request(prompt, rid: str, max_tokens: int) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        request_id=rid, model="demo", token_ids=list(prompt), eos_token_ids=[151645, 151643],
        stop=common_pb2.StopConditions(ignore_eos=True, max_tokens=max_tokens)))


async def read_tokens(call) -> list[int]:
    tokens = []
    while True:
        batch = await asyncio.wait_for(call.next_batch(), 10)
        tokens.extend(t for m in batch.messages for t in m.token_ids)
        if batch.error is not None:
            raise batch.error
        if batch.ended:
            return tokens


async def first_tokens(call) -> list[int]:
    batch = await asyncio.wait_for(call.next_batch(), 10)
    return [t for m in batch.messages for t in m.token_ids]


@pytest.fixture
async def mux():
    client = MuxWorkerClient()
    yield client
    await client.close()


async def test_concurrent_calls_share_one_stream_and_get_their_own_tokens(start_mocker, mux):
    worker = await start_mocker("--speedup-ratio", "10")
    requests = [generate_request(range(100 * i, 100 * i + 30), f"r{i}", 12) for i in range(1, 7)]
    expected = [[t async for m in worker.stub.Generate(r) for t in m.token_ids] for r in requests]
    got = await asyncio.gather(*(read_tokens(mux.generate(worker.address, r)) for r in requests))
    assert got == expected
    assert len(mux._streams) == 1


async def test_cancel_ends_that_call_only_and_frees_its_blocks(start_mocker, mux):
    worker = await start_mocker("--speedup-ratio", "2")
    long = mux.generate(worker.address, generate_request(range(200), "long", 3000))
    short = mux.generate(worker.address, generate_request(range(500, 530), "short", 30))
    assert await first_tokens(long)
    long.cancel()
    long.cancel()  # idempotent
    assert (await long.next_batch()).ended
    assert len(await read_tokens(short)) == 30
    deadline = asyncio.get_running_loop().time() + 5
    while worker.engine.cache.active_blocks:
        assert asyncio.get_running_loop().time() < deadline, "the cancelled sequence kept its blocks"
        await asyncio.sleep(0.01)


async def test_a_rejected_request_keeps_its_reason(start_mocker, mux):
    worker = await start_mocker("--speedup-ratio", "0")
    with pytest.raises(InvalidRequest):
        await read_tokens(mux.generate(worker.address, generate_request([], "empty", 4)))
    assert len(await read_tokens(mux.generate(worker.address, generate_request(range(20), "ok", 4)))) == 4


async def test_a_broken_stream_fails_every_open_call_and_the_next_call_reconnects(model_dir, mux):
    cfg = parse_config(["--model-dir", str(model_dir), "--port", "0", "--no-register", "--speedup-ratio", "2"], env={})
    engine = build_engine(cfg)
    server = build_server(cfg.worker, engine)
    server.grace_s = 0
    await engine.start()
    await server.start()
    port = server.port
    calls = [mux.generate(server.address, generate_request(range(100 * i, 100 * i + 30), f"r{i}", 3000))
             for i in (1, 2, 3)]
    for call in calls:
        assert await first_tokens(call)
    await server.stop()  # the worker dies with three sequences running
    await engine.close()
    for call in calls:
        with pytest.raises(WorkerFailed):
            await read_tokens(call)
    cfg = parse_config(["--model-dir", str(model_dir), "--port", str(port), "--no-register",
                        "--speedup-ratio", "0"], env={})
    engine = build_engine(cfg)
    server = build_server(cfg.worker, engine)
    server.grace_s = 0
    await engine.start()
    await server.start()
    try:
        assert len(await read_tokens(mux.generate(server.address, generate_request(range(20), "again", 5)))) == 5
    finally:
        await server.stop()
        await engine.close()


async def test_the_postprocessor_streams_a_workers_text_over_it(start_mocker, demo_model_dir):
    worker = await start_mocker("--speedup-ratio", "20", "--output-text", "One, two, three, four.")

    async def text(client) -> tuple[str, str]:
        postprocessor = Postprocessor(client)
        try:
            req = postprocessor_pb2.GenerateRequest(worker_address=worker.address)
            req.options.model_dir = str(demo_model_dir)
            req.request.request_id = "pp"
            req.request.token_ids.extend([151644, 77091, 198])
            req.request.stop.stop_token_ids_hidden.extend([151645, 151643])
            responses = [r async for r in postprocessor.generate(req)]
            return "".join(r.text for r in responses), common_pb2.FinishReason.Name(responses[-1].finish_reason)
        finally:
            await client.close()

    assert await text(MuxWorkerClient()) == ("One, two, three, four.", "FINISH_REASON_EOS")
