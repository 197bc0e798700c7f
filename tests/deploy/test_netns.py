"""The split mesh across separate hosts: one network namespace per service, each with its own address.

NATS, a mocker worker, the preprocessor, router, postprocessor, gateway, Envoy and
the client each run in their own namespace on 10.213.0.0/24 (a subnet that exists
only inside the namespaces this test creates), with loopback DOWN everywhere: any
code path that dials or binds 127.0.0.1 fails here. Services learn every address
from flags or from NATS discovery, as they do on Kubernetes. Needs root (or
CAP_NET_ADMIN + CAP_SYS_ADMIN) for ``ip netns``; without it the test skips locally
and fails under CI=true, naming what was refused.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from bench import netns
from services.launcher.envoy_config import render
from services.launcher.plan import VENV_BIN
from tests.conftest import IN_CI, MOCKER_SCRIPT

pytestmark = pytest.mark.deploy

MODEL = "meshfront/demo-qwen"
NATS, PRE, ROUTER, POST, GATEWAY, ENVOY, WORKER, CLIENT = (
    ("nats", 10), ("preprocessor", 11), ("router", 12), ("postprocessor", 13), ("gateway", 14), ("envoy", 15),
    ("worker", 20), ("client", 30))
HOSTS = (NATS, PRE, ROUTER, POST, GATEWAY, ENVOY, WORKER, CLIENT)

# Runs on the client host: waits for every service's port and the model, then one plain and one streamed chat.
CLIENT_SCRIPT = """
import json, socket, sys, time
import httpx, openai
url = sys.argv[1]
deadline = time.monotonic() + float(sys.argv[2])
for address in sys.argv[4:]:  # every service's port, dialled from this host
    host, port = address.rsplit(":", 1)
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
models = []
while time.monotonic() < deadline and not models:
    try:
        models = [m["id"] for m in httpx.get(url + "/v1/models", timeout=1).json()["data"]]
    except Exception:
        time.sleep(0.2)
client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20)
msgs = [{"role": "user", "content": "Hello"}]
reply = client.chat.completions.create(model=sys.argv[3], messages=msgs, max_tokens=8)
chunks = client.chat.completions.create(model=sys.argv[3], messages=msgs, max_tokens=8, stream=True)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
print(json.dumps({"models": models, "text": reply.choices[0].message.content, "streamed": streamed,
                  "tokens": reply.usage.completion_tokens}))
"""

LOOPBACK_PROBE = """
import socket
try:
    socket.create_connection(("127.0.0.1", 9200), timeout=1)
except OSError as e:
    print("refused", e.errno)
else:
    print("connected")
"""


@pytest.fixture(scope="module")
def lab():
    try:
        netns.probe()
    except netns.NetnsUnavailable as e:
        message = f"network namespaces are not available here: {e}"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    lab = netns.Lab("10.213.0")
    try:
        for host, octet in HOSTS:
            lab.add_host(host, octet)
        yield lab
    finally:
        lab.close()


def _service(lab, host: str, module: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", module, "--host", lab.hosts[host], "--port", str(port),
            "--nats-url", f"nats://{lab.hosts['nats']}:4222", *extra]


@pytest.fixture(scope="module")
def split_mesh(lab, tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    """Starts every service on its own host; yields the Envoy URL (as the client host sees it)."""
    logs = tmp_path_factory.mktemp("netns-logs")
    env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    h = lab.hosts
    lab.start("nats", [nats_bin, "-js", "-a", h["nats"], "-p", "4222", "-sd", str(logs / "nats")], logs / "nats.log")
    lab.start("worker", _service(lab, "worker", "services.workers.mocker", 9500, "--model-dir", str(demo_model_dir),
                                 "--model-name", MODEL, "--script", str(MOCKER_SCRIPT), "--speedup-ratio", "0"),
              logs / "worker.log", env)
    for host, module, port in ((PRE[0], "services.preprocessor", 9200), (ROUTER[0], "services.router", 9300)):
        lab.start(host, _service(lab, host, module, port), logs / f"{host}.log", env)
    # The postprocessor calls the router when it migrates a stream.
    lab.start("postprocessor", _service(lab, "postprocessor", "services.postprocessor", 9400, "--router",
                                        f"{h['router']}:9300"), logs / "postprocessor.log", env)
    lab.start("gateway", _service(lab, "gateway", "services.gateway", 9100,
                                  "--preprocessor", f"{h['preprocessor']}:9200",
                                  "--router", f"{h['router']}:9300", "--postprocessor", f"{h['postprocessor']}:9400"),
              logs / "gateway.log", env)
    envoy_yaml = logs / "envoy.yaml"
    envoy_yaml.write_text(render(listen_host=h["envoy"], listen_port=8000, admin_host=h["envoy"], admin_port=9901,
                                 gateways=[(h["gateway"], 9100)]))
    lab.start("envoy", [envoy_bin, "-c", str(envoy_yaml), "--concurrency", "1", "--log-level", "warn",
                        "--base-id", str(20000 + int(time.time()) % 10000)], logs / "envoy.log")
    yield f"http://{h['envoy']}:8000", logs
    stubborn = lab.stop_processes()
    assert not stubborn, f"processes ignored SIGTERM: {stubborn}"


def _all_logs(logs) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(logs.glob("*.log")))


def test_every_host_has_its_own_address_and_no_loopback(lab):
    for host, _ in HOSTS:
        shown = lab.run(host, ["ip", "-4", "-o", "addr", "show"], timeout=10).stdout
        assert shown.count(" inet ") == 1 and f"inet {lab.hosts[host]}/24" in shown, shown
    probe = lab.run("gateway", [sys.executable, "-c", LOOPBACK_PROBE], timeout=10)
    assert probe.stdout.startswith("refused"), probe.stdout + probe.stderr


def test_chat_across_hosts(lab, split_mesh):
    url, logs = split_mesh
    h = lab.hosts
    ports = [f"{h['worker']}:9500", f"{h['preprocessor']}:9200", f"{h['router']}:9300",
             f"{h['postprocessor']}:9400", f"{h['gateway']}:9100"]
    r = lab.run("client", [str(VENV_BIN / "python"), "-c", CLIENT_SCRIPT, url, "60", MODEL, *ports], timeout=90)
    assert r.returncode == 0, f"{r.stderr[-3000:]}\n{_all_logs(logs)}"
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["models"] == [MODEL]
    assert result["text"] and result["tokens"] > 0
    assert result["streamed"] == result["text"]
    # The worker registered the address it listens on, not a loopback or wildcard name.
    worker_log = (logs / "worker.log").read_text(errors="replace")
    assert lab.hosts["worker"] in worker_log and "127.0.0.1" not in worker_log, worker_log[-2000:]
