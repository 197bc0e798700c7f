"""--auth through Envoy and two gateways: keys made with `meshfront keys`, checked at every front door by the
official openai, anthropic and tritonclient clients; revocation, quotas across both gateways, usage; the model
lists, KServe's metadata and media models, the other routes (images, LoRA, files, an extension route) and what
stays open."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import re
import subprocess
import time

import anthropic
import httpx
import nats
import numpy as np
import openai
import pytest

from services.common.namespace import Namespace
from services.gateway.auth.store import USAGE_BUCKET
from services.launcher.plan import VENV_BIN
from tests.conftest import require_module, stop_cleanly
from tests.mesh.conftest import DEMO, DEMO_PARSERS, SECOND, mocker, start_mesh, wait_until

require_module("tritonclient")
import tritonclient.grpc as triton  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.mesh

HI = [{"role": "user", "content": "Say hello"}]
IMAGE = "meshfront/demo-image"
ROUTES = "examples.route_extension.status_routes:routes"  # GET /example/status, POST /example/echo


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS),
                                      mocker(demo_model_dir, SECOND),
                                      mocker(demo_model_dir, IMAGE, "10", "--media", "image")],
                   gateways=2, service_args={"gateway": ("--auth", "--frontend-route-extension", ROUTES)})
    yield m
    stop_cleanly(m)


def keys(mesh, *args: str) -> list[str]:
    """`meshfront keys ARGS` against the mesh's NATS (through its env twin); its output lines."""
    out = subprocess.run([str(VENV_BIN / "meshfront"), "keys", *args], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "NATS_SERVER": mesh.plan.nats_url}, check=True)
    return out.stdout.splitlines()


def new_key(mesh, tenant: str, *limits: str) -> str:
    return keys(mesh, "create", "--tenant", tenant, *limits)[-1]


def oai(mesh, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{mesh.url}/v1", api_key=key, max_retries=0, timeout=30)


def triton_infer(mesh, key: str | None):
    client = triton.InferenceServerClient(mesh.grpc_target)
    text = triton.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Count to ten"], dtype=np.object_))
    try:
        return client.infer(DEMO, [text], parameters={"max_tokens": 3},
                            headers={"authorization": f"Bearer {key}"} if key else None)
    finally:
        client.close()


def test_no_key_is_401_in_each_callers_shape_and_the_probes_stay_open(mesh):
    with pytest.raises(openai.AuthenticationError) as e:
        oai(mesh, "mf-not-a-key").chat.completions.create(model=DEMO, messages=HI)
    assert e.value.code == "invalid_api_key"
    r = httpx.post(f"{mesh.url}/v1/completions", json={"model": DEMO, "prompt": "hi"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    claude = anthropic.Anthropic(base_url=mesh.url, api_key="mf-not-a-key", max_retries=0, timeout=30)
    with pytest.raises(anthropic.AuthenticationError) as a:
        claude.messages.create(model=DEMO, max_tokens=8, messages=HI)
    assert a.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(InferenceServerException) as k:
        triton_infer(mesh, None)
    assert k.value.status() == "StatusCode.UNAUTHENTICATED"
    for path in ("/health", "/live", "/metrics"):
        assert httpx.get(f"{mesh.url}{path}", timeout=10).status_code == 200, path


def test_a_key_works_at_every_front_door_and_revocation_holds_within_2s(mesh):
    key = new_key(mesh, "acme")
    client = oai(mesh, key)
    assert client.chat.completions.create(model=DEMO, messages=HI, max_tokens=8).choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in
                   client.chat.completions.create(model=DEMO, messages=HI, max_tokens=8, stream=True) if c.choices)
    claude = anthropic.Anthropic(base_url=mesh.url, api_key=key, max_retries=0, timeout=30)  # x-api-key
    assert claude.messages.create(model=DEMO, max_tokens=8, messages=HI).content[0].text
    assert triton_infer(mesh, key).as_numpy("text_output") is not None
    listed = "\n".join(keys(mesh, "list"))
    assert "tenant=acme" in listed and key not in listed

    key_id = next(line.split()[0] for line in keys(mesh, "list") if "tenant=acme" in line)
    assert keys(mesh, "revoke", key_id) == [f"revoked {key_id} (tenant acme)"]
    revoked = time.monotonic()

    def refused() -> bool:
        try:
            client.completions.create(model=DEMO, prompt="hi", max_tokens=1)
        except openai.AuthenticationError:
            return True
        return False
    wait_until(refused, 2.0, "the revoked key to be refused")
    assert time.monotonic() - revoked < 2.0


def test_rpm_holds_across_both_gateways_with_openais_headers(mesh):
    key = new_key(mesh, "limited", "--rpm", "5")

    def one(_: int) -> httpx.Response:
        return httpx.post(f"{mesh.url}/v1/completions", headers={"authorization": f"Bearer {key}"},
                          json={"model": DEMO, "prompt": "hi", "max_tokens": 1}, timeout=30)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 5 + [429] * 3, [r.text for r in answers]
    for r in answers:
        assert r.headers["x-ratelimit-limit-requests"] == "5"
        assert re.fullmatch(r"(1m0s|\d+s)", r.headers["x-ratelimit-reset-requests"])
    assert sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in answers if r.status_code == 200) \
        == [0, 1, 2, 3, 4]
    refused = next(r for r in answers if r.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    with pytest.raises(openai.RateLimitError):
        oai(mesh, key).completions.create(model=DEMO, prompt="hi", max_tokens=1)

    # Both gateways admitted some (each replica keeps its own usage record), and the totals add up.
    assert len(asyncio.run(usage_replicas(mesh, "limited"))) == 2
    wait_until(lambda: "requests=5 " in "".join(keys(mesh, "usage", "--tenant", "limited")), 5, "usage flushed")
    line = keys(mesh, "usage", "--tenant", "limited")[0]
    assert "rejected: requests=4" in line and "completion_tokens=5" in line
    metrics = httpx.get(f"{mesh.url}/metrics", timeout=10).text
    assert re.search(r'meshfront_tenant_rejections_total\{[^}]*tenant="limited"[^}]*\} ', metrics), metrics[-2000:]


async def usage_replicas(mesh, tenant: str) -> set[str]:
    nc = await nats.connect(mesh.plan.nats_url)
    try:
        kv = await nc.jetstream().key_value(Namespace.of(mesh.plan.namespace).bucket(USAGE_BUCKET))
        deadline = time.monotonic() + 5
        while True:
            found = {k.partition(".")[2] for k in await kv.keys() if k.startswith(f"{tenant}.")}
            if len(found) >= 2 or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


def test_anthropic_rate_limit_shape(mesh):
    key = new_key(mesh, "claude-user", "--rpm", "1")
    claude = anthropic.Anthropic(base_url=mesh.url, api_key=key, max_retries=0, timeout=30)
    ok = claude.messages.with_raw_response.create(model=DEMO, max_tokens=4, messages=HI)
    assert ok.headers["anthropic-ratelimit-requests-limit"] == "1"
    assert ok.headers["anthropic-ratelimit-requests-remaining"] == "0"
    with pytest.raises(anthropic.RateLimitError) as e:
        claude.messages.create(model=DEMO, max_tokens=4, messages=HI)
    assert e.value.body["error"]["type"] == "rate_limit_error"
    assert e.value.response.headers["retry-after"] and e.value.response.headers["anthropic-ratelimit-requests-reset"]


def test_a_key_limited_to_other_models_gets_404(mesh):
    key = new_key(mesh, "second-only", "--models", SECOND)
    client = oai(mesh, key)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model=DEMO, messages=HI, max_tokens=4)
    assert e.value.code == "model_not_found"
    assert client.completions.create(model=SECOND, prompt="hi", max_tokens=2).choices


def test_a_key_from_a_secret_is_registered_once_and_a_revoke_sticks(mesh, monkeypatch):
    """What the Kubernetes Job does with the first key (deploy/k8s/base/first-key.yaml): reruns change nothing."""
    secret = "mf-" + "k8s-first-key-0123456789abcdefghijklmnop"
    monkeypatch.setenv("MESHFRONT_FIRST_KEY", secret)
    created = keys(mesh, "create", "--tenant", "admin", "--secret-env", "MESHFRONT_FIRST_KEY")
    assert created[0].startswith("created key_") and secret not in "\n".join(created)
    assert oai(mesh, secret).completions.create(model=DEMO, prompt="hi", max_tokens=1).choices
    assert keys(mesh, "create", "--tenant", "admin", "--secret-env", "MESHFRONT_FIRST_KEY")[0].endswith(
        "exists; left as it is")
    keys(mesh, "revoke", secret)
    assert keys(mesh, "create", "--tenant", "admin", "--secret-env", "MESHFRONT_FIRST_KEY")[0].endswith(
        "was revoked; it stays revoked")


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_the_model_lists_need_a_key_and_show_only_its_models(mesh):
    for path in ("/v1/models", f"/v1/models/{SECOND}"):
        r = httpx.get(f"{mesh.url}{path}", timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    claude = anthropic.Anthropic(base_url=mesh.url, api_key="mf-not-a-key", max_retries=0, timeout=30)
    with pytest.raises(anthropic.AuthenticationError) as a:
        claude.models.list()
    assert a.value.body["error"]["type"] == "authentication_error"

    assert {m.id for m in oai(mesh, new_key(mesh, "all-models")).models.list()} == {DEMO, SECOND, IMAGE}
    key = new_key(mesh, "listed", "--models", SECOND)
    client = oai(mesh, key)
    assert [m.id for m in client.models.list()] == [SECOND]
    assert client.models.retrieve(SECOND).id == SECOND
    with pytest.raises(openai.NotFoundError):  # served, but not to this key: as unknown as a model nobody serves
        client.models.retrieve(DEMO)
    claude = anthropic.Anthropic(base_url=mesh.url, api_key=key, max_retries=0, timeout=30)  # x-api-key
    assert [m.id for m in claude.models.list()] == [SECOND]


def test_kserve_metadata_and_media_models_need_a_key_and_the_probes_do_not(mesh):
    client = triton.InferenceServerClient(mesh.grpc_target)
    key = new_key(mesh, "triton", "--models", f"{SECOND},{IMAGE}")
    try:
        assert client.is_server_live() and client.is_server_ready()  # health probes: no key
        for call in (client.get_server_metadata, lambda: client.is_model_ready(SECOND),
                     lambda: client.get_model_metadata(SECOND), lambda: client.get_model_config(SECOND)):
            with pytest.raises(InferenceServerException) as e:
                call()
            assert e.value.status() == "StatusCode.UNAUTHENTICATED"
        assert client.get_server_metadata(headers=bearer(key)).name
        assert client.is_model_ready(SECOND, headers=bearer(key))
        assert not client.is_model_ready(DEMO, headers=bearer(key))  # served, not to this key
        assert client.get_model_metadata(SECOND, headers=bearer(key)).name == SECOND
        with pytest.raises(InferenceServerException) as e:
            client.get_model_config(DEMO, headers=bearer(key))
        assert e.value.status() == "StatusCode.NOT_FOUND"

        prompt = triton.InferInput("prompt", [1], "BYTES")
        prompt.set_data_from_numpy(np.array([b"a red fox"], dtype=np.object_))
        params = {"size": "64x64", "steps": 1}
        with pytest.raises(InferenceServerException) as e:
            client.infer(IMAGE, [prompt], parameters=params)
        assert e.value.status() == "StatusCode.UNAUTHENTICATED"
        assert client.infer(IMAGE, [prompt], parameters=params, headers=bearer(key)).as_numpy("output")[0][:4] \
            == b"\x89PNG"
        # A stream's requests present the stream's key, media models' as text models' do.
        answers: queue.Queue = queue.Queue()
        for headers, ok in ((bearer(key), True), (None, False)):
            client.start_stream(lambda result, error: answers.put((result, error)), headers=headers)
            try:
                client.async_stream_infer(IMAGE, [prompt], parameters=params)
                result, error = answers.get(timeout=30)
            finally:
                client.stop_stream()
            if ok:
                assert error is None and result.as_numpy("output")[0][:4] == b"\x89PNG"
            else:
                assert result is None and "API key" in str(error)
    finally:
        client.close()


def test_every_other_route_needs_a_key_but_the_open_ones(mesh):
    nobody = httpx.Client(base_url=mesh.url, timeout=30)
    for method, path, body in (("POST", "/v1/images/generations", {"model": IMAGE, "prompt": "a fox"}),
                               ("POST", "/v1/embeddings", {"model": DEMO, "input": "hi"}),
                               ("POST", "/v1/responses", {"model": DEMO, "input": "hi"}),
                               ("POST", "/v1/videos", {"model": DEMO, "prompt": "a fox"}),
                               ("GET", "/v1/files", None), ("GET", "/v1/batches", None),
                               ("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}),
                               ("POST", "/v1/unload_lora_adapter", {"lora_name": "a"}),
                               ("GET", "/example/status", None), ("POST", "/example/echo", {"text": "hi"})):
        r = nobody.request(method, path, json=body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    r = nobody.post("/v1/messages/count_tokens", json={"model": DEMO, "messages": HI})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    for path in ("/openapi.json", "/docs"):
        assert nobody.get(path).status_code == 200, path
    # A generated image's URL is its own credential: an unknown one is a 404, never a 401.
    assert nobody.get("/v1/media/0123456789abcdef0123456789abcdef").status_code == 404

    key = new_key(mesh, "everything")
    client = oai(mesh, key)
    [image] = client.images.generate(model=IMAGE, prompt="a red fox", size="64x64", response_format="b64_json").data
    assert image.b64_json
    assert client.files.list().data == [] and client.batches.list().data == []
    status = httpx.get(f"{mesh.url}/example/status", headers=bearer(key), timeout=30)
    assert status.status_code == 200 and DEMO in status.json()["models"]

    # A key limited to one model: other models' adapters are not its to change (a 404, where a key for every model
    # hears that no model serves LoRA), nor their images its to make.
    load = {"lora_name": "an-adapter", "lora_path": "/adapters/a", "base_model_name": DEMO}
    r = httpx.post(f"{mesh.url}/v1/load_lora_adapter", headers=bearer(key), json=load, timeout=30)
    assert r.status_code == 400 and "LoRA" in r.json()["error"]["message"], r.text
    limited = new_key(mesh, "one-model", "--models", SECOND)
    r = httpx.post(f"{mesh.url}/v1/load_lora_adapter", headers=bearer(limited), json=load, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    with pytest.raises(openai.NotFoundError):
        oai(mesh, limited).images.generate(model=IMAGE, prompt="a red fox", size="64x64")
    # An extension route names no model, and generates nothing: it spends no quota.
    one_a_minute = new_key(mesh, "one-model-rpm", "--models", SECOND, "--rpm", "1")
    for _ in range(2):
        assert httpx.get(f"{mesh.url}/example/status", headers=bearer(one_a_minute), timeout=30).status_code == 200
    assert oai(mesh, one_a_minute).completions.create(model=SECOND, prompt="hi", max_tokens=1).choices
