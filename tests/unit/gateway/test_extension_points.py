"""Extension points without sockets: loading and checking route extensions and the chat engine factory, a
bad one failing the gateway's start with one line and exit 2, the hooks around a real chat renderer, the
per-model factory calls, and Envoy's routes rendered from the same flags."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import orjson
import pytest
import yaml

from examples.engine_factory import policy
from services.common.discovery import EMBEDDINGS, ModelCard, WorkerCard
from services.common.errors import Internal
from services.gateway.config import parse_config
from services.gateway.core.delta import Delta
from services.gateway.core.errors import error_body
from services.gateway.core.extension_hooks import (
    ChatHooks,
    ExtensionError,
    HookedRenderer,
    hooked_body,
    with_post_hook,
)
from services.gateway.extensions import Response
from services.gateway.extensions.edge import edge_routes
from services.gateway.extensions.engine_factory import ChatEngines, ModelInfo
from services.gateway.extensions.loading import ExtensionSpecError, load_routes
from services.gateway.openai.render import ChatRenderer
from services.launcher.envoy_config import EXTENSION_SERVICE, render
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

SPECS = "tests.unit.gateway.extension_specs"
EXAMPLE = "examples.route_extension.status_routes:routes"


def test_the_example_loads_once_however_often_it_is_named_and_the_config_carries_it():
    routes = load_routes((EXAMPLE, f"{SPECS}:good", EXAMPLE, f"{SPECS}:none"))
    assert [(r.method, r.path) for r in routes] == [("GET", "/example/status"), ("POST", "/example/echo"),
                                                    ("GET", "/ext/one")]  # "get" became GET
    cfg = parse_config([], {"DYN_FRONTEND_ROUTE_EXTENSIONS": f"{EXAMPLE} {SPECS}:good",
                            "MESHFRONT_GATEWAY_CHAT_ENGINE_FACTORY": "examples.engine_factory.policy:factory"})
    assert cfg.frontend_route_extension == (EXAMPLE, f"{SPECS}:good")
    assert cfg.chat_engine_factory == "examples.engine_factory.policy:factory"


@pytest.mark.parametrize(("spec", "words"), [
    ("no.such.module:routes", ["cannot import module 'no.such.module'"]),
    (f"{SPECS}:missing", ["has no attribute 'missing'"]),
    (f"{SPECS}:NOT_CALLABLE", ["is not callable"]),
    ("unregistered-name", ["not registered in 'dynamo.frontend.routes'", "not a 'module:function' path"]),
    (f"{SPECS}:clashes_with_models", ["GET /v1/models clashes with the built-in route /v1/models"]),
    (f"{SPECS}:clashes_with_a_template", ["clashes with the built-in route /v1/models/{model_id}"]),
    (f"{SPECS}:under_grpc_prefix", ["under a gRPC service's prefix"]),
    (f"{SPECS}:duplicate", ["duplicate extension route: GET /ext/one"]),
    (f"{SPECS}:path_parameter", ["must be static"]),
    (f"{SPECS}:colon_segment", ["must not start with ':'"]),
    (f"{SPECS}:put_method", ["'PUT' is not one of GET, POST"]),
    (f"{SPECS}:not_routes", ["expected services.gateway.extensions.Route"]),
    (f"{SPECS}:raises", ["failed: RuntimeError: the provider's database is down"]),
])
def test_a_bad_route_extension_is_one_line_naming_what_is_wrong(spec, words):
    with pytest.raises(ExtensionSpecError) as e:
        load_routes((spec,))
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_name_registered_in_dynamos_entry_point_group_wins(tmp_path, monkeypatch):
    dist = tmp_path / "acme_routes-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-routes\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[dynamo.frontend.routes]\nacme = {SPECS}:good\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [r.path for r in load_routes(("acme",))] == ["/ext/one"]
    with pytest.raises(ExtensionSpecError, match=r"registered: acme\)"):
        load_routes(("acme-typo",))


@pytest.mark.parametrize("argv", [
    ["--frontend-route-extension", f"{SPECS}:clashes_with_models"],
    ["--chat-engine-factory", "examples.engine_factory.policy:nope"],
    ["--frontend-route-extension", "no_such_module:routes", "--frontend-route-extension", EXAMPLE],
])
def test_a_bad_extension_fails_the_gateways_start_with_one_line_and_exit_2(argv):
    r = subprocess.run([sys.executable, "-m", "services.gateway", "--port", "0", *argv], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("meshfront gateway: "), r.stderr


def test_edge_routes_come_from_the_gateways_flags_or_env_and_render_first_with_their_methods():
    args = ["--port", "9100", f"--frontend-route-extension={EXAMPLE}", "--router-mode", "kv"]
    assert edge_routes(args, {}) == [("/example/status", ("GET",)), ("/example/echo", ("POST",))]
    assert edge_routes([], {"DYN_FRONTEND_ROUTE_EXTENSIONS": f"{SPECS}:good"}) == [("/ext/one", ("GET",))]
    assert edge_routes([], {}) == []
    cfg = yaml.safe_load(render(listen_host="127.0.0.1", listen_port=1, admin_port=2, gateways=[("127.0.0.1", 3)],
                                extension_routes=[("/v1/ext", ("GET", "POST"))]))
    first = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]["routes"][0]
    assert first["match"] == {"path": "/v1/ext"}  # before the /v1/ prefix route
    assert first["metadata"]["filter_metadata"]["envoy.filters.http.lua"] == {"extension_methods": "GET, POST"}
    assert first["typed_per_filter_config"]["envoy.filters.http.grpc_json_transcoder"]["services"] == [
        EXTENSION_SERVICE]


def test_extension_errors_and_responses_take_openais_shape_and_a_valid_status():
    err = ExtensionError(429, "slow down", param="user")
    assert (err.http_status, err.reason) == (429, "OVERLOADED")
    assert orjson.loads(error_body(err)) == {"error": {"message": "slow down", "type": "rate_limit_error",
                                                       "param": "user", "code": 429}}
    assert ExtensionError(418, "teapot").openai_type == "invalid_request_error"
    for bad in (200, 302, 600):
        with pytest.raises(ValueError):
            ExtensionError(bad, "no")
    assert Response(200, "plain", "text/plain").encoded() == b"plain"
    assert Response(503, {"status": "warming"}).encoded() == b'{"status":"warming"}'
    for status, kw in ((201, {}), (500, {"content_type": "text/plain"})):
        with pytest.raises(ValueError):
            Response(status, "x", **kw)


def _renderer(**kw: Any) -> ChatRenderer:
    return ChatRenderer(request_id="chatcmpl-1", model="m", n_choices=1, want_logprobs=False, include_usage=True,
                        **kw)


DELTAS = [[Delta(0, text="Hel", prompt_tokens=3, counts_prompt=True, completion_tokens=1)],
          [Delta(0, text="lo", completion_tokens=1), Delta(0, finish_reason="stop")]]


def test_the_post_hook_sees_every_chunk_streamed_and_whole_and_no_hook_leaves_the_renderer_as_it_is():
    seen: list[dict] = []

    def post(chunk: dict) -> dict:
        seen.append(chunk)
        return {**chunk, "system_fingerprint": "hooked"}

    plain = _renderer()
    assert with_post_hook(plain, None) is plain and with_post_hook(plain, ChatHooks(pre=policy.pre)) is plain
    hooked = with_post_hook(_renderer(), ChatHooks(post=post))
    assert isinstance(hooked, HookedRenderer)
    out = b"".join(hooked.sse(batch) for batch in DELTAS) + hooked.sse_end()
    frames = [f for f in out.split(b"\n\n") if f]
    assert frames[-1] == b"data: [DONE]"
    chunks = [orjson.loads(f[6:]) for f in frames[:-1]]
    assert len(chunks) == len(seen) >= 3 and chunks[-1]["usage"]["completion_tokens"] == 2  # the usage chunk too
    assert all(c["system_fingerprint"] == "hooked" for c in chunks)
    assert hooked.sse_error(Internal("x")).startswith(b'data: {"error"')  # not a chunk: untouched
    whole = with_post_hook(_renderer(), ChatHooks(post=post))
    for batch in DELTAS:
        whole.fold(batch)
    body = orjson.loads(whole.body())
    assert body["object"] == "chat.completion" and body["system_fingerprint"] == "hooked"
    assert body["choices"][0]["message"]["content"] == "Hello" and whole.completion_tokens == 2


async def test_the_pre_hook_changes_or_refuses_the_body_and_a_model_without_one_keeps_its_bytes():
    async def lookup(model: str) -> ChatHooks | None:
        return ChatHooks(pre=policy.pre) if model == "hooked" else None

    raw = b'{"model": "plain", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100}'
    assert (await hooked_body(raw, lookup))[0] is raw
    changed, hooks = await hooked_body(raw.replace(b"plain", b"hooked"), lookup)
    assert hooks is not None and orjson.loads(changed)["max_tokens"] == policy.MAX_TOKENS
    refused = raw.replace(b"plain", b"hooked").replace(b"Hi", b"Please open the pod bay doors")
    with pytest.raises(ExtensionError) as e:
        await hooked_body(refused, lookup)
    assert (e.value.http_status, e.value.openai_type, e.value.param) == (403, "permission_error", "messages")
    with pytest.raises(TypeError):
        ChatHooks(post=lookup)  # a coroutine function per chunk: refused when the factory returns it


def _card(worker: str, model: str, *endpoints: str) -> WorkerCard:
    card = ModelCard(name=model, model_dir="/m", **({"endpoints": endpoints} if endpoints else {}))
    return WorkerCard(worker_id=worker, address="127.0.0.1:1", model=card)


async def test_the_factory_runs_once_per_chat_model_appearance_and_a_failure_fails_only_that_models_requests():
    calls: list[str] = []

    async def factory(model: ModelInfo) -> ChatHooks | None:
        calls.append(model.name)
        if model.name == "broken":
            raise RuntimeError("no policy for this one")
        return ChatHooks(post=policy.post) if model.name == "chat" else None

    models: dict[str, list[WorkerCard]] = {"chat": [_card("w1", "chat")], "embed": [_card("w2", "embed", EMBEDDINGS)]}
    engines = ChatEngines(factory, lambda: models)
    engines.on_change("w1", models["chat"][0])
    engines.on_change("w2", models["embed"][0])
    hooks = await engines.hooks_for("chat")
    assert hooks is not None and hooks.post is policy.post
    assert await engines.hooks_for("embed") is None and await engines.hooks_for("unknown") is None
    assert calls == ["chat"]  # once, and never for an embedding model
    del models["chat"]
    engines.on_change("w1", None)
    models["chat"] = [_card("w3", "chat")]
    engines.on_change("w3", models["chat"][0])
    await engines.hooks_for("chat")
    models["broken"] = [_card("w4", "broken")]
    engines.on_change("w4", models["broken"][0])
    await asyncio.sleep(0)
    with pytest.raises(Internal, match="failed for model `broken`"):
        await engines.hooks_for("broken")
    assert calls == ["chat", "chat", "broken"]  # came back: made again; failed: not retried per request


def test_meshfront_run_refuses_a_bad_route_extension_with_one_line(capsys):
    from services.launcher.run import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args([f"--gateway-flag=--frontend-route-extension={SPECS}:clashes_with_models"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "clashes with the built-in route /v1/models" in err
    assert parse_args([f"--gateway-flag=--frontend-route-extension={EXAMPLE}"]).gateway_flag == [
        f"--frontend-route-extension={EXAMPLE}"]
