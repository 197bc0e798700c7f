"""The router's side of disaggregated serving on a live mesh: roles registered by `--disaggregation-mode`,
pins that route where they say, wrong-role and unknown pins that are a 400 naming the field, conditional
disaggregation and its enforcement, and /v1/models listing each model once.

Two prefill and two decode mockers serve the demo model; one whole-request worker serves a second model,
which has no prefill worker, so that `--enforce-disagg` refuses it. Where a request ran is read from the
router's own counters (every routing decision) and from `nvext.worker_id` (both workers of a split request;
one worker twice for an aggregated one).
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from services.launcher.plan import WorkerSpec
from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, SECOND, start_mesh, wait_until
from tests.mesh.test_metrics import parse, value

pytestmark = pytest.mark.mesh

PREFILL = ("pf-a", "pf-b")
DECODE = ("dc-a", "dc-b")
SHORT = 48  # --router-conditional-disagg-config max_local_prefill_length: fewer uncached tokens stay aggregated


def worker(model_dir, model: str, worker_id: str, mode: str) -> WorkerSpec:
    return WorkerSpec(str(model_dir), model, "mocker", ("--speedup-ratio", "200", "--worker-id", worker_id,
                                                        "--disaggregation-mode", mode))


@pytest.fixture(scope="module")
def roles_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    workers = [*(worker(demo_model_dir, DEMO, w, "prefill") for w in PREFILL),
               *(worker(demo_model_dir, DEMO, w, "decode") for w in DECODE),
               worker(demo_model_dir, SECOND, "whole-x", "agg")]
    router = ("--router-conditional-disagg", "--router-conditional-disagg-config",
              f'{{"max_local_prefill_length": {SHORT}}}', "--enforce-disagg")
    m = start_mesh(tmp_path_factory, workers, router_mode="kv", service_args={"router": router})
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(roles_mesh):
    c = sdk_client(roles_mesh, timeout=30)
    yield c
    c.close()


def decisions(mesh, **labels) -> float:
    text = httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports['router']}/metrics", timeout=5).text
    return value(parse(text), "meshfront_router_disagg_decisions", "_total", **labels)


def routed(mesh, worker_id: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports['router']}/metrics", timeout=5).text
    return value(parse(text), "meshfront_router_routed_requests", "_total", worker=worker_id)


def long_prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"case {i}: " + " ".join(f"w{(i * 31 + k) % 613}" for k in range(150))}]


def test_models_are_listed_once_whatever_roles_serve_them(client):
    assert sorted(m.id for m in client.models.list().data) == sorted([DEMO, SECOND])


def test_pins_route_where_they_say_and_leave_the_ignored_fields_header(roles_mesh, client):
    before = routed(roles_mesh, "pf-b")
    r = client.chat.completions.with_raw_response.create(
        model=DEMO, messages=long_prompt(1), max_tokens=4,
        extra_body={"nvext": {"prefill_worker_id": "pf-b", "decode_worker_id": "dc-a", "extra_fields": ["worker_id"]}})
    assert r.status_code == 200 and "x-meshfront-ignored-fields" not in r.headers
    assert r.parse().model_extra["nvext"]["worker_id"] == {"prefill_worker_id": "pf-b", "decode_worker_id": "dc-a"}
    assert routed(roles_mesh, "pf-b") == before + 1  # its prefill leg was booked there
    # The header pins the prefill worker too, and wins over the body.
    before = routed(roles_mesh, "pf-a")
    r = client.chat.completions.with_raw_response.create(
        model=DEMO, messages=long_prompt(2), max_tokens=4, extra_headers={"x-prefill-instance-id": "pf-a"},
        extra_body={"nvext": {"prefill_worker_id": "pf-b", "decode_worker_id": "dc-b",
                              "extra_fields": ["worker_id"]}})
    assert r.status_code == 200 and "x-meshfront-ignored-fields" not in r.headers
    assert r.parse().model_extra["nvext"]["worker_id"] == {"prefill_worker_id": "pf-a", "decode_worker_id": "dc-b"}
    assert routed(roles_mesh, "pf-a") == before + 1


@pytest.mark.parametrize(("nvext", "headers", "param", "says"), [
    ({"prefill_worker_id": "dc-a"}, {}, "nvext.prefill_worker_id", "is a decode worker, not a prefill worker"),
    ({}, {"x-prefill-instance-id": "987654321"}, "x-prefill-instance-id", "does not serve model"),
    ({"decode_worker_id": "pf-a"}, {}, "nvext.decode_worker_id", "it cannot decode"),
    ({"decode_worker_id": 987654321}, {}, "nvext.decode_worker_id", "does not serve model"),
    ({"backend_instance_id": "pf-b"}, {}, "nvext.backend_instance_id", "a prefill worker of model"),
])
def test_a_wrong_role_or_unknown_pin_is_a_400_naming_the_field(client, nvext, headers, param, says):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=long_prompt(3), max_tokens=2, extra_headers=headers,
                                       extra_body={"nvext": nvext})
    message = e.value.body["message"]
    assert e.value.body["param"] == param and says in message
    # The error names what the client sent, and only that: the body field, or the header.
    assert ("nvext" not in message and message.startswith(f"The {param} header names worker")) if headers else \
        ("-instance-id" not in message and message.startswith(f"'{param}' names worker"))


def test_anthropic_messages_and_responses_honour_both_pin_headers(roles_mesh, client):
    """The same pins on every front end (services/gateway/core/pins.py): x-prefill-instance-id pins the prefill
    leg, x-worker-instance-id the decode worker, through the official SDKs' own header option."""
    pins = {"x-prefill-instance-id": "pf-b", "x-worker-instance-id": "dc-b"}
    claude = anthropic.Anthropic(base_url=roles_mesh.url, api_key="unused", max_retries=0, timeout=30)
    try:
        prefill, decode = routed(roles_mesh, "pf-b"), routed(roles_mesh, "dc-b")
        msg = claude.messages.create(model=DEMO, max_tokens=4, messages=long_prompt(11), extra_headers=pins)
        assert msg.usage.output_tokens == 4
        assert (routed(roles_mesh, "pf-b"), routed(roles_mesh, "dc-b")) == (prefill + 1, decode + 1)
    finally:
        claude.close()
    prefill, decode = routed(roles_mesh, "pf-b"), routed(roles_mesh, "dc-b")
    r = client.responses.create(model=DEMO, input=long_prompt(12)[0]["content"], max_output_tokens=4,
                                extra_headers=pins)
    assert r.usage.output_tokens == 4  # "incomplete": max_output_tokens ended it
    assert (routed(roles_mesh, "pf-b"), routed(roles_mesh, "dc-b")) == (prefill + 1, decode + 1)


@pytest.mark.parametrize(("headers", "says"), [
    ({"x-prefill-instance-id": "dc-a"}, "which is a decode worker, not a prefill worker"),
    ({"x-prefill-instance-id": "987654321"}, "which does not serve model"),
    ({"x-worker-instance-id": "pf-a"}, f"a prefill worker of model `{DEMO}`: pin its prefill leg with the "
                                       "x-prefill-instance-id header"),
])
def test_a_wrong_role_or_unknown_pin_header_is_a_400_naming_the_header_on_messages_and_responses(
        roles_mesh, client, headers, says):
    """/v1/messages and /v1/responses have no nvext: the error names the header the client sent, never a field."""
    [header] = headers
    claude = anthropic.Anthropic(base_url=roles_mesh.url, api_key="unused", max_retries=0, timeout=30)
    try:
        with pytest.raises(anthropic.BadRequestError) as a:
            claude.messages.create(model=DEMO, max_tokens=2, messages=long_prompt(13), extra_headers=headers)
    finally:
        claude.close()
    assert a.value.body["type"] == "error" and a.value.body["error"]["type"] == "invalid_request_error"
    message = a.value.body["error"]["message"]
    assert message.startswith(f"The {header} header names worker") and says in message and "nvext" not in message
    with pytest.raises(openai.BadRequestError) as o:
        client.responses.create(model=DEMO, input="Hi", max_output_tokens=2, extra_headers=headers)
    message = o.value.body["message"]
    assert message.startswith(f"The {header} header names worker") and says in message and "nvext" not in message
    assert o.value.body["param"] == header


def test_a_short_prompt_stays_on_its_decode_worker_and_a_long_one_is_split(roles_mesh, client):
    short, split = decisions(roles_mesh, reason="short_prompt"), decisions(roles_mesh, reason="disaggregated")
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       extra_body={"nvext": {"extra_fields": ["worker_id"]}})
    assert r.usage.prompt_tokens <= SHORT
    workers = r.model_extra["nvext"]["worker_id"]
    assert workers["decode_worker_id"] in DECODE and workers["prefill_worker_id"] == workers["decode_worker_id"]
    assert decisions(roles_mesh, reason="short_prompt") == short + 1
    r = client.chat.completions.create(model=DEMO, messages=long_prompt(4), max_tokens=4,
                                       extra_body={"nvext": {"extra_fields": ["worker_id"]}})
    workers = r.model_extra["nvext"]["worker_id"]
    assert workers["prefill_worker_id"] in PREFILL and workers["decode_worker_id"] in DECODE
    assert decisions(roles_mesh, reason="disaggregated") == split + 1


def test_enforced_disaggregation_refuses_a_model_without_prefill_workers(client):
    with pytest.raises(openai.InternalServerError) as e:  # 503: no prefill worker to split it
        client.chat.completions.create(model=SECOND, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert e.value.status_code == 503 and "--enforce-disagg" in e.value.body["message"]
    # A client's worker pin still runs where it says.
    r = client.chat.completions.create(model=SECOND, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       extra_headers={"x-worker-instance-id": "whole-x"})
    assert r.usage.completion_tokens == 2


def test_a_prompt_the_decode_worker_caches_by_transfer_then_stays_there_aggregated(roles_mesh, client):
    """The decode pool's KV events reach the router's index: the blocks a transfer brought make the same prompt
    a cached one on that worker, which conditional disaggregation then keeps aggregated there."""
    body = {"model": DEMO, "messages": long_prompt(5), "max_tokens": 4,
            "extra_body": {"nvext": {"extra_fields": ["worker_id"]}}}
    first = client.chat.completions.create(**body).model_extra["nvext"]["worker_id"]
    assert first["prefill_worker_id"] in PREFILL
    decode = first["decode_worker_id"]
    cached = decisions(roles_mesh, reason="cached_prompt")

    def indexed() -> float:
        text = httpx.get(f"http://127.0.0.1:{roles_mesh.plan.metrics_ports['router']}/metrics", timeout=5).text
        return value(parse(text), "meshfront_router_kv_index_blocks", worker=decode)

    wait_until(lambda: indexed() >= 8, 10, "the decode worker's blocks in the router's index")
    again = client.chat.completions.create(**body).model_extra["nvext"]["worker_id"]
    assert again == {"prefill_worker_id": decode, "decode_worker_id": decode}
    assert decisions(roles_mesh, reason="cached_prompt") == cached + 1
