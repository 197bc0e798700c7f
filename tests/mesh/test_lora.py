"""LoRA adapters through Envoy and the split mesh, four mocker workers, kv routing (docs/lora.md).

``held-0`` and ``held-1`` start with the adapters ``ada``, ``bob``, ``dan`` and ``eve`` (``--lora-modules``)
and no runtime loading; ``load-0`` and ``load-1`` start with none and load at runtime. Every worker runs
one adapter at a time (``--max-loras 1``). Which worker served a request comes back in
``nvext.worker_id`` (``extra_fields``).
"""

from __future__ import annotations

import contextlib
import re
import urllib.request

import httpx
import openai
import pytest

from services.models.qwen_lora import default_demo_adapter_dir
from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(180)]

HELD, LOADERS = ("held-0", "held-1"), ("load-0", "load-1")
ADAPTERS = ("ada", "bob", "dan", "eve", "fay")
PREFIX = " ".join(["river garden apple stone light bread music window"] * 20)  # 160 words


@pytest.fixture(scope="module")
def adapter_dir():
    return default_demo_adapter_dir()


@pytest.fixture(scope="module")
def lora_mesh(tmp_path_factory, demo_model_dir, adapter_dir, envoy_bin, nats_bin):
    modules = ",".join(f"{name}={adapter_dir}" for name in ADAPTERS)
    held = [mocker(demo_model_dir, DEMO, "1", "--worker-id", w, "--enable-lora", "--lora-modules", modules,
                   "--max-loras", "1") for w in HELD]
    loaders = [mocker(demo_model_dir, DEMO, "1", "--worker-id", w, "--enable-lora", "--lora-runtime-loading",
                      "--max-loras", "1") for w in LOADERS]
    m = start_mesh(tmp_path_factory, held + loaders, router_mode="kv")
    wait_until(lambda: health_models(m).get("ada") == 2 and health_models(m).get(DEMO) == 4, 60, "the workers")
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(lora_mesh):
    c = sdk_client(lora_mesh, timeout=30)
    yield c
    c.close()


def models(mesh) -> dict[str, dict]:
    body = httpx.get(f"{mesh.url}/v1/models", timeout=10).json()
    return {m["id"]: m for m in body["data"]}


def ask(client, model: str, text: str = "Say hello", **kw):
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], max_tokens=4,
                                       extra_body={"nvext": {"extra_fields": ["worker_id"]}}, **kw)
    return r, r.model_extra["nvext"]["worker_id"]["decode_worker_id"]


def load(mesh, **body) -> httpx.Response:
    return httpx.post(f"{mesh.url}/v1/load_lora_adapter", json=body, timeout=60)


def unload(mesh, **body) -> httpx.Response:
    return httpx.post(f"{mesh.url}/v1/unload_lora_adapter", json=body, timeout=60)


def router_metric(mesh, name: str) -> float:
    port = mesh.plan.metrics_ports["router"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def test_models_lists_each_adapter_with_its_base(lora_mesh, client):
    listed = models(lora_mesh)
    for name in ADAPTERS:
        assert listed[name]["parent"] == DEMO and listed[name]["root"] == DEMO
    assert "parent" not in listed[DEMO]
    got = client.models.retrieve("ada")
    assert got.id == "ada" and got.model_extra["parent"] == DEMO
    assert str(default_demo_adapter_dir()) not in httpx.get(f"{lora_mesh.url}/v1/models").text  # no paths


def test_adapter_requests_go_only_to_workers_holding_it(client):
    seen = set()
    for i in range(12):
        r, worker = ask(client, "ada", f"Say hello {i}")
        assert r.model == "ada" and r.choices[0].message.content
        seen.add(worker)
    assert seen <= set(HELD) and seen, seen


def test_unknown_adapter_is_404_in_openai_envelope(lora_mesh, client):
    with pytest.raises(openai.NotFoundError) as e:
        ask(client, "no-such-adapter")
    assert e.value.body["code"] == "model_not_found" and "no-such-adapter" in e.value.body["message"]
    r = unload(lora_mesh, lora_name="no-such-adapter")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["message"] == "The lora adapter 'no-such-adapter' cannot be found." and err["param"] == "lora_name"


def test_bad_load_requests_are_400s(lora_mesh, tmp_path):
    assert load(lora_mesh, lora_name="x").status_code == 400  # no lora_path
    assert load(lora_mesh, lora_name=DEMO, lora_path="/tmp").json()["error"]["param"] == "lora_name"
    r = load(lora_mesh, lora_name="ghost", lora_path=str(tmp_path))  # no adapter_config.json there
    assert r.status_code == 400 and "adapter_config.json" in r.json()["error"]["message"], r.text
    assert str(tmp_path) not in r.text or "lora_path" in r.text
    assert "ghost" not in models(lora_mesh)
    r = load(lora_mesh, lora_name="ada", lora_path="/elsewhere")  # held, and no worker would load it again
    assert r.status_code == 400


def test_load_and_unload_across_the_fleet(lora_mesh, client, adapter_dir):
    r = load(lora_mesh, lora_name="carl", lora_path=str(adapter_dir))
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'carl' added successfully."
    assert r.headers["content-type"].startswith("text/plain")
    assert models(lora_mesh)["carl"]["parent"] == DEMO
    assert {ask(client, "carl", f"Say hello {i}")[1] for i in range(8)} <= set(LOADERS)
    assert load(lora_mesh, lora_name="carl", lora_path=str(adapter_dir)).status_code == 400  # loaded already
    r = unload(lora_mesh, lora_name="carl")
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'carl' removed successfully."
    assert "carl" not in models(lora_mesh)
    with pytest.raises(openai.NotFoundError):
        ask(client, "carl")


def test_salted_hashes_predict_hits_per_adapter(lora_mesh, client):
    text = f"{PREFIX} salted"
    first, worker = ask(client, "bob", text)
    predicted = router_metric(lora_mesh, "meshfront_router_predicted_cached_tokens_total")
    wait_until(lambda: router_metric(lora_mesh, "meshfront_router_kv_index_blocks") >= 10, 5, "bob's blocks indexed")
    again, again_worker = ask(client, "bob", text)
    assert again_worker == worker and again.usage.prompt_tokens_details.cached_tokens >= 128
    wait_until(lambda: router_metric(lora_mesh, "meshfront_router_predicted_cached_tokens_total") >= predicted + 128,
               5, "the router to predict the hit")
    # The same tokens under another adapter, and under the base model, are other blocks: no hit anywhere.
    for model in ("dan", DEMO):
        before = router_metric(lora_mesh, "meshfront_router_predicted_cached_tokens_total")
        other, _ = ask(client, model, text)
        assert other.usage.prompt_tokens_details.cached_tokens == 0, model
        assert router_metric(lora_mesh, "meshfront_router_predicted_cached_tokens_total") == before, model


def _hold(client, model: str, stack: contextlib.ExitStack) -> str:
    """Starts a long streamed request under ``model`` and returns its worker once its first chunk is in."""
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello"}], max_tokens=2000, stream=True,
        extra_body={"ignore_eos": True, "nvext": {"extra_fields": ["worker_id"]}})
    stack.callback(stream.close)
    first = next(iter(stream))
    return first.model_extra["nvext"]["worker_id"]["decode_worker_id"]


def health_models(mesh) -> dict[str, int]:
    """Live workers per served name, adapters included (GET /health)."""
    return httpx.get(f"{mesh.url}/health", timeout=10).json()["models"]


def test_adapter_limit_loads_at_runtime_then_503(lora_mesh, client):
    runtime_loads = 'meshfront_router_lora_requests_total{adapter="dan",placement="runtime_load"}'
    before = router_metric(lora_mesh, runtime_loads)
    with contextlib.ExitStack() as stack:
        # Each holder runs one adapter now (max_loras 1): no other adapter fits on either.
        assert {_hold(client, "ada", stack), _hold(client, "bob", stack)} == set(HELD)
        # dan: no holder has a slot, so the least-loaded loader loads it for this request, and lists it.
        assert _hold(client, "dan", stack) == "load-0"
        assert router_metric(lora_mesh, runtime_loads) == before + 1
        assert health_models(lora_mesh)["dan"] == 3
        assert ask(client, "ada")[1] in HELD  # fits where ada runs already
        assert _hold(client, "eve", stack) == "load-1"
        # fay fits nowhere: every worker runs its one adapter (the router's queue is off: 503 at once).
        with pytest.raises(openai.APIStatusError) as e:
            ask(client, "fay")
        assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"
        assert "max_loras" in e.value.body["message"], e.value.body
    # Closing the streams frees the slots: fay runs now.
    wait_until(lambda: _fits(client, "fay"), 10, "a free adapter slot")


def _fits(client, model: str) -> bool:
    try:
        ask(client, model)
    except openai.APIStatusError as e:
        if e.status_code == 503:
            return False
        raise
    return True
