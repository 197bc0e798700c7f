"""NATS as a 3-node JetStream cluster (``meshfront run --nats-cluster 3``): every bucket has three replicas,
and killing a node under load fails no request and loses no stored response.

The node killed leads a bucket's stream, the worst one to lose: the worker bucket must elect a new leader while
the workers keep renewing their cards (a card that lapses takes its worker out of routing); the responses bucket
while responses are being stored. Every client connected to that node fails over to another URL of
``--nats-url``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import threading
import time

import nats
import openai
import pytest

from services.common.discovery import BUCKET as WORKERS_BUCKET
from services.common.namespace import DEFAULT_NAMESPACE
from services.gateway.media.store import BUCKET as MEDIA_BUCKET
from services.gateway.responses_api.store import BUCKET as RESPONSES_BUCKET
from services.gateway.videos.job_store import BUCKET as VIDEO_JOBS_BUCKET
from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(180)]

# The mesh's namespace is the default one (services/common/namespace.py); the worker bucket is every namespace's.
STREAMS = {"workers": f"KV_{WORKERS_BUCKET}", "responses": f"KV_{DEFAULT_NAMESPACE.bucket(RESPONSES_BUCKET)}",
           "video jobs": f"KV_{DEFAULT_NAMESPACE.bucket(VIDEO_JOBS_BUCKET)}",
           "media": f"OBJ_{DEFAULT_NAMESPACE.bucket(MEDIA_BUCKET)}"}


@pytest.fixture(scope="module")
def cluster_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "20"), mocker(demo_model_dir, DEMO, "20")],
                   nats_cluster=3)
    yield m
    stop_cleanly(m)


def _stream_infos(url: str) -> dict[str, object]:
    async def run():
        nc = await nats.connect(url.split(","), connect_timeout=2)
        try:
            js = nc.jetstream()
            return {what: await js.stream_info(name) for what, name in STREAMS.items()}
        finally:
            await nc.close()

    return asyncio.run(run())


def test_the_mesh_connects_to_every_node_and_replicates_every_bucket(cluster_mesh):
    plan = cluster_mesh.plan
    assert len(plan.nats_url.split(",")) == 3 and plan.nats_names == ["nats", "nats-1", "nats-2"]
    # The stores open their buckets in the background once the gateway starts: wait for all four.
    infos = wait_until(lambda: _try(lambda: _stream_infos(plan.nats_url)), 20, "every bucket")
    for what, info in infos.items():
        assert info.config.num_replicas == 3, what
        assert info.cluster.leader and len(info.cluster.replicas) == 2, what


def _try(call):
    try:
        return call()
    except Exception:  # noqa: BLE001 - not there yet
        return None


@pytest.mark.parametrize("bucket", ["workers", "responses"])
def test_killing_a_node_under_load_fails_nothing_and_stored_responses_survive(cluster_mesh, bucket):
    """The node killed leads ``bucket``'s stream: the workers' cards, or the stored responses being written."""
    client = sdk_client(cluster_mesh, timeout=60)
    stored = [client.responses.create(model=DEMO, input=f"Say hello {i}", store=True) for i in range(5)]
    leader = wait_until(lambda: _try(lambda: _stream_infos(cluster_mesh.plan.nats_url)[bucket].cluster.leader), 20,
                        f"a leader for the {bucket} bucket")
    assert leader in cluster_mesh.plan.nats_names

    stop = threading.Event()
    failures: list[str] = []
    done = {"chat": 0, "responses": 0}
    written: list[str] = []

    def load(i: int) -> None:
        while not stop.is_set():
            try:
                if i % 4 == 0:  # stored responses are written while the node dies too
                    r = client.responses.create(model=DEMO, input=f"Count to five {i}", store=True,
                                                max_output_tokens=16)
                    written.append(r.id)
                    done["responses"] += 1
                else:
                    chunks = list(client.chat.completions.create(
                        model=DEMO, messages=[{"role": "user", "content": f"count to ten {i}"}], max_tokens=32,
                        stream=True))
                    assert chunks[-1].choices[0].finish_reason in ("stop", "length"), chunks[-1]
                    done["chat"] += 1
            except (openai.OpenAIError, AssertionError) as e:
                failures.append(f"{type(e).__name__}: {e}")

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        runs = [pool.submit(load, i) for i in range(12)]
        time.sleep(2)
        before = sum(done.values())
        cluster_mesh.kill(leader, signal.SIGKILL)
        cluster_mesh.procs[leader].wait(10)
        # Past the cards' 6 s TTL: a worker whose renewals stalled on the dead leader would have dropped out.
        time.sleep(10)
        stop.set()
        for run in runs:
            run.result()
    assert before > 0 and sum(done.values()) > before + 20 and done["responses"] > 0, done
    assert failures == []
    # The bucket moved on to a new leader on a surviving node.
    info = wait_until(lambda: _try(lambda: _stream_infos(cluster_mesh.plan.nats_url)[bucket]), 10,
                      f"the {bucket} bucket")
    assert info.cluster.leader != leader
    for r in stored + [client.responses.retrieve(i) for i in written[-3:]]:
        again = client.responses.retrieve(r.id)
        assert again.id == r.id and again.output_text == r.output_text
    client.close()
    cluster_mesh.restart(leader)  # the node comes back (as `meshfront run` restarts it) for a clean stop
