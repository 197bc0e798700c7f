"""The gateway's MuxPostprocessor against a real postprocessor server (and a scripted fake worker).

Requests share one ``GenerateStream`` per replica; the postprocessor's own errors keep their reason;
a caller that goes away cancels its request down to the worker; a ``dns:///`` target is resolved
into replicas, and a name that also lists an address nobody serves still gets every request through.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc
from meshfront.worker.v1 import worker_pb2
from tokenizers import Tokenizer

from services.common.errors import InvalidRequest
from services.common.grpc_server import GrpcServer
from services.common.targets import split_target
from services.gateway.postprocessor_mux import MuxPostprocessor
from services.models.qwen import EOS_TOKEN_IDS
from services.postprocessor.server import PostprocessorServicer
from services.postprocessor.service import Postprocessor
from tests.service.postprocessor.fake_worker import Forever

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

EOS = common_pb2.FINISH_REASON_EOS


@pytest.fixture(scope="module")
async def postprocessor_address():
    postprocessor = Postprocessor()
    server = GrpcServer("postprocessor", "127.0.0.1", 0, grace_s=0)
    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(PostprocessorServicer(postprocessor),
                                                                     server.server)
    await server.start()
    yield server.address
    await server.stop()
    await postprocessor.close()


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    return Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))


@pytest.fixture
def scripted(demo_model_dir, fake_worker, tokenizer):
    """A request whose worker answers ``text`` in two messages (or runs forever with ``forever``)."""
    worker, address = fake_worker

    def make(text: str, forever: bool = False):
        req = postprocessor_pb2.GenerateRequest(worker_address=address)
        req.options.model_dir = str(demo_model_dir)
        req.request.request_id = uuid.uuid4().hex
        req.request.token_ids.extend([151644, 77091, 198])
        req.request.stop.stop_token_ids_hidden.extend(EOS_TOKEN_IDS)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        first = worker_pb2.GenerateResponse(token_ids=ids[:2], prompt_tokens=3)
        rest = (Forever(worker_pb2.GenerateResponse(token_ids=ids[2:3]), every=0.01) if forever
                else worker_pb2.GenerateResponse(token_ids=[*ids[2:], EOS_TOKEN_IDS[0]], finish_reason=EOS))
        cancelled = worker.script(req.request.request_id, [first, 0.01, rest])
        return req, cancelled
    return make


async def text_of(client: MuxPostprocessor, req) -> str:
    return "".join([r.text async for ready in client.generate(req) for r in ready])


def test_targets_split_into_replicas():
    assert split_target("127.0.0.1:9400") == (["127.0.0.1:9400"], None)
    assert split_target("ipv4:10.0.0.1:9400,10.0.0.2:9400") == (["ipv4:10.0.0.1:9400", "ipv4:10.0.0.2:9400"], None)
    assert split_target("dns:///post.ns.svc:9400") == ([], ("post.ns.svc", 9400))
    assert split_target("dns://8.8.8.8/post:9400") == ([], ("post", 9400))
    with pytest.raises(ValueError, match="name:port"):
        split_target("dns:///post")


async def test_concurrent_requests_share_one_stream_and_keep_their_text(postprocessor_address, scripted):
    client = MuxPostprocessor(postprocessor_address)
    texts = [f"Request number {i} says hello." for i in range(8)]
    requests = [scripted(t)[0] for t in texts]
    assert await asyncio.gather(*(text_of(client, r) for r in requests)) == texts
    (replica,) = client._set.replicas.values()
    stream = replica.stream
    assert await text_of(client, scripted("Once more.")[0]) == "Once more."
    assert replica.stream is stream and not stream.broken  # the same stream served every request
    await client.close()


async def test_the_postprocessors_errors_keep_their_reason(postprocessor_address, scripted):
    client = MuxPostprocessor(postprocessor_address)
    req, _ = scripted("unused")
    req.worker_address = ""
    with pytest.raises(InvalidRequest, match="worker_address"):
        await text_of(client, req)
    assert await text_of(client, scripted("Still fine.")[0]) == "Still fine."  # the stream outlived the error
    await client.close()


async def test_a_caller_that_goes_away_cancels_its_request_on_the_worker(postprocessor_address, scripted):
    client = MuxPostprocessor(postprocessor_address)
    req, cancelled = scripted("never ending story", forever=True)
    responses = client.generate(req)
    assert (await anext(responses))[0].text
    await responses.aclose()  # what the gateway does when the client hangs up
    await asyncio.wait_for(cancelled.wait(), 10)
    await client.close()


async def test_a_dns_name_is_resolved_into_replicas_and_a_dead_one_is_skipped(postprocessor_address, scripted):
    port = postprocessor_address.rsplit(":", 1)[1]
    client = MuxPostprocessor(f"dns:///localhost:{port}")
    assert await text_of(client, scripted("Resolved by name.")[0]) == "Resolved by name."
    assert "ipv4:127.0.0.1:" + port in client._set.replicas
    # A name that also resolves to an address nobody serves: requests that go there start over.
    client._set._add("ipv4:127.0.0.2:" + port)
    texts = [f"Through whichever replica {i}." for i in range(4)]
    assert await asyncio.gather(*(text_of(client, scripted(t)[0]) for t in texts)) == texts
    await client.close()
