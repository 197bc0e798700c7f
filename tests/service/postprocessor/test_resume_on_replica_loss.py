"""A postprocessor replica dies mid-stream: the gateway's client resumes its streams, token-identical.

Real pieces on loopback: a mocker worker in its pseudo-random mode (an answer is a function of the
prompt and seed, and a longer prompt continues it), postprocessor servers on the multiplexed worker
transport, and the gateway's ``MuxPostprocessor``. A replica is stopped without a drain (its streams
are cut, as a SIGKILL cuts them) once the caller got part of the answer; the caller must still see the
undisturbed answer, once, with the same usage, served on by the other replica or the restarted one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc

from services.common.grpc_server import GrpcServer
from services.gateway.postprocessor_mux import MuxPostprocessor
from services.postprocessor.mux_client import MuxWorkerClient
from services.postprocessor.server import PostprocessorServicer
from services.postprocessor.service import Postprocessor
from services.workers.mocker.config import parse_config
from services.workers.mocker.main import build_engine
from services.workers.server import build_server
from tests.frozen_proxy import FrozenProxy

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

TOKENS = 80
CUT_AFTER = 12  # completion tokens the caller has when its replica goes away


class Recorded(Postprocessor):
    """The real postprocessor, noting every request it was sent (which replica a request is on)."""

    def __init__(self, workers: MuxWorkerClient):
        super().__init__(workers)
        self.requests: list[postprocessor_pb2.GenerateRequest] = []

    def generate(self, req):
        self.requests.append(req)
        return super().generate(req)


@dataclasses.dataclass
class Replica:
    postprocessor: Recorded
    server: GrpcServer

    def serves(self, request_id: str) -> bool:
        return any(r.request.request_id == request_id for r in self.postprocessor.requests)


@pytest.fixture
async def mesh(demo_model_dir):
    """A mocker worker (~12 ms a token) and a way to start postprocessor replicas (on a given port too)."""
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--port", "0", "--no-register", "--speedup-ratio", "0.5"],
                       env={})
    engine = build_engine(cfg)
    worker = build_server(cfg.worker, engine)
    worker.grace_s = 0
    await engine.start()
    await worker.start()
    clients: list[MuxWorkerClient] = []
    servers: list[GrpcServer] = []

    async def replica(port: int = 0) -> Replica:
        clients.append(MuxWorkerClient())
        postprocessor = Recorded(clients[-1])
        server = GrpcServer("postprocessor", "127.0.0.1", port, grace_s=0)
        postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(PostprocessorServicer(postprocessor),
                                                                         server.server)
        await server.start()
        servers.append(server)
        return Replica(postprocessor, server)

    yield worker.address, replica
    for server in servers:
        await server.server.stop(0)
    for client in clients:
        await client.close()
    await worker.stop()
    await engine.close()


def request(demo_model_dir, worker_address: str) -> postprocessor_pb2.GenerateRequest:
    req = postprocessor_pb2.GenerateRequest(worker_address=worker_address, worker_id="w0")
    req.options.model_dir = str(demo_model_dir)
    req.request.request_id = uuid.uuid4().hex
    req.request.model = "demo"
    req.request.token_ids.extend([151644, 872, 198, 14990, 1879, 151645, 198, 151644, 77091, 198])
    req.request.sampling.seed = 1234
    req.request.stop.max_tokens = TOKENS
    req.request.stop.ignore_eos = True
    return req


async def run(client: MuxPostprocessor, req, on_cut=None) -> tuple[str, int, int, int]:
    """(text, completion tokens, finish reason, responses carrying usage) of one stream; ``on_cut`` runs
    once ``CUT_AFTER`` tokens have arrived, while the stream stays open."""
    text, tokens, finish, usage = [], 0, 0, 0
    async for ready in client.generate(req):
        for r in ready:
            text.append(r.text)
            tokens += r.completion_tokens
            finish = r.finish_reason or finish
            usage += bool(r.prompt_tokens)
        if on_cut is not None and tokens >= CUT_AFTER:
            await on_cut()
            on_cut = None
    assert on_cut is None, "the stream ended before it could be cut"
    return "".join(text), tokens, finish, usage


def assert_resumed_on(others: list[Replica], req: postprocessor_pb2.GenerateRequest) -> None:
    """The one other replica took the stream over where the caller was, and did not start it over."""
    (alive,) = others
    resumed = alive.postprocessor.requests[-1]
    assert resumed.request.request_id == req.request.request_id
    assert CUT_AFTER <= len(resumed.resume.token_ids) < TOKENS


async def kill(replica: Replica) -> None:
    await replica.server.server.stop(0)  # no drain: every stream on it is cut, as by a SIGKILL


async def test_streams_of_a_killed_replica_finish_on_the_other_token_identical(demo_model_dir, mesh):
    worker_address, replica = mesh
    a, b = await replica(), await replica()
    client = MuxPostprocessor(f"ipv4:{a.server.address},{b.server.address}")
    try:
        want = await run(client, request(demo_model_dir, worker_address))
        assert want[1:] == (TOKENS, common_pb2.FINISH_REASON_LENGTH, 1) and want[0]
        req = request(demo_model_dir, worker_address)

        killed: list[Replica] = []

        async def cut() -> None:
            (serving,) = [r for r in (a, b) if r.serves(req.request.request_id)]
            killed.append(serving)
            await kill(serving)

        got = await run(client, req, cut)
        assert got == want
        assert_resumed_on([r for r in (a, b) if r is not killed[0]], req)
    finally:
        await client.close()


async def test_streams_of_the_one_replica_finish_on_its_restart_token_identical(demo_model_dir, mesh):
    """``make run``'s shape: one replica, restarted on its port a moment after it died."""
    worker_address, replica = mesh
    a = await replica()
    port = int(a.server.address.rsplit(":", 1)[1])
    client = MuxPostprocessor(a.server.address, wait_s=10)
    restarted: list[Replica] = []
    try:
        want = await run(client, request(demo_model_dir, worker_address))
        reqs = [request(demo_model_dir, worker_address) for _ in range(3)]

        async def cut() -> None:
            await kill(a)

            async def restart() -> None:
                await asyncio.sleep(0.5)
                restarted.append(await replica(port))
            asyncio.get_running_loop().create_task(restart())

        # Three streams at once on the one replica: the cut of the first one takes all of them.
        got = await asyncio.gather(run(client, reqs[0], cut), *(run(client, r) for r in reqs[1:]))
        assert got == [want] * 3
        (back,) = restarted
        resumed = [r for r in back.postprocessor.requests if r.HasField("resume")]
        assert reqs[0].request.request_id in {r.request.request_id for r in resumed}
        assert all(CUT_AFTER <= len(r.resume.token_ids) < TOKENS for r in resumed if r.request == reqs[0].request)
    finally:
        await client.close()



async def test_streams_of_a_frozen_replica_finish_on_the_other_within_seconds(demo_model_dir, mesh):
    """A replica that stops answering but keeps its connection (SIGSTOP, a wedged host): the channel's
    pings (PINGED_CHANNEL_OPTIONS) give it up in about 2 s, and its streams resume on the other."""
    worker_address, replica = mesh
    a, b = await replica(), await replica()
    proxies = {id(r): FrozenProxy(r.server.address) for r in (a, b)}
    for proxy in proxies.values():
        await proxy.start()
    client = MuxPostprocessor(f"ipv4:{proxies[id(a)].address},{proxies[id(b)].address}")
    try:
        want = await run(client, request(demo_model_dir, worker_address))
        req = request(demo_model_dir, worker_address)
        frozen: list[Replica] = []

        async def freeze() -> None:
            (serving,) = [r for r in (a, b) if r.serves(req.request.request_id)]
            frozen.append(serving)
            proxies[id(serving)].freeze()

        assert await asyncio.wait_for(run(client, req, freeze), 15) == want
        assert_resumed_on([r for r in (a, b) if r is not frozen[0]], req)
    finally:
        await client.close()
        for proxy in proxies.values():
            await proxy.close()
