"""components/disagg: prefill and decode pools, each its own Deployment and scaling, with their role on the
worker's flag and on the pods' labels (what Prometheus labels their series with)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from services.common.flags import FlagParser
from services.launcher.engine_env import ENGINES
from services.workers.config import DISAGGREGATION_MODES, add_worker_flags
from tests.conftest import IN_CI, ROOT
from tests.deploy.test_k8s import K8S, _help, containers, env_of, env_twins, with_component, workloads

pytestmark = pytest.mark.deploy

DISAGG = K8S / "components" / "disagg"
ROLE_LABEL = "meshfront.dev/worker-role"


def _deployments() -> dict[str, dict]:
    return {w["metadata"]["name"]: w for w in workloads(with_component(DISAGG)) if w["kind"] == "Deployment"}


def test_prefill_and_decode_pools_are_separate_deployments_with_their_role():
    deployments = _deployments()
    pools = {name: d for name, d in deployments.items() if ROLE_LABEL in d["spec"]["template"]["metadata"]["labels"]}
    assert set(pools) == {"mocker-prefill", "mocker-decode"}
    selectors = [d["spec"]["selector"]["matchLabels"] for d in pools.values()]
    for name, d in pools.items():
        role = name.removeprefix("mocker-")
        template = d["spec"]["template"]
        assert template["metadata"]["labels"][ROLE_LABEL] == role == d["metadata"]["labels"][ROLE_LABEL]
        # Each pool scales alone: its selector matches its own pods and not the other pool's.
        own = d["spec"]["selector"]["matchLabels"]
        assert own.items() <= template["metadata"]["labels"].items()
        assert sum(s.items() <= template["metadata"]["labels"].items() for s in selectors) == 1
        assert d["spec"]["replicas"] >= 1
        [worker] = containers(d, init=False)
        env = env_of(worker)
        assert env["MESHFRONT_MOCKER_DISAGGREGATION_MODE"] == role and role in DISAGGREGATION_MODES
        assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        assert template["metadata"]["annotations"]["prometheus.io/port"] == env["MESHFRONT_MOCKER_METRICS_PORT"]
        help_text = _help("mocker")
        for name_ in env:
            if name_.startswith("MESHFRONT_"):
                assert name_ in env_twins(help_text), f"{name}: {name_} is no flag's twin"


def test_the_aggregated_workers_give_way_and_the_router_routes_by_cache():
    deployments = _deployments()
    assert deployments["mocker"]["spec"]["replicas"] == 0
    [router] = containers(deployments["router"], init=False)
    assert env_of(router)["MESHFRONT_ROUTER_ROUTER_MODE"] == "kv"
    assert "MESHFRONT_ROUTER_ROUTER_CONDITIONAL_DISAGG" in env_twins(_help("router"))


# -- components/disagg-vllm: the GPU pools ------------------------------------------------------------------

DISAGG_VLLM = K8S / "components" / "disagg-vllm"
KV_ROLES = {"prefill": ("kv_producer", "kv_both"), "decode": ("kv_consumer", "kv_both")}  # transfer.role_errors'


def worker_and_engine_flags(container: dict) -> tuple:
    parser = FlagParser("vllm", "", env_of(container), allow_abbrev=False)
    add_worker_flags(parser, engine_sized=True, disaggregation=True)
    args, engine_argv = parser.parse_known(container["args"])
    return args, list(engine_argv)


def vllm_pools() -> dict[str, dict]:
    return {w["metadata"]["name"]: w for w in workloads(with_component(DISAGG_VLLM))
            if ROLE_LABEL in w["spec"]["template"]["metadata"]["labels"]}


def test_vllm_prefill_and_decode_pools_scale_alone_on_gpus_with_nixl():
    pools = vllm_pools()
    assert set(pools) == {"vllm-prefill", "vllm-decode"}
    selectors = [d["spec"]["selector"]["matchLabels"] for d in pools.values()]
    for name, d in pools.items():
        role = name.removeprefix("vllm-")
        template = d["spec"]["template"]
        labels = template["metadata"]["labels"]
        assert labels[ROLE_LABEL] == role == d["metadata"]["labels"][ROLE_LABEL]
        assert sum(s.items() <= labels.items() for s in selectors) == 1  # each pool's selector is its own
        assert d["spec"]["replicas"] >= 1 and d["spec"]["strategy"]["type"] == "Recreate"
        [worker] = containers(d)
        assert worker["command"] == ["meshfront", "vllm"] and "meshfront-vllm:" in worker["image"]
        # As `meshfront vllm` splits its flags (engine_worker.parse_engine_flags, less the model directory's
        # check): the role is the worker's flag, the connector config reaches vLLM untouched.
        args, argv = worker_and_engine_flags(worker)
        assert args.disaggregation_mode == role
        transfer = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert transfer["kv_connector"] == "NixlConnector" and transfer["kv_role"] in KV_ROLES[role]
        tensor_parallel = int(argv[argv.index("--tensor-parallel-size") + 1])
        resources = worker["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == tensor_parallel
        # NIXL's side channel listens on the pod IP (its default, localhost, no other pod reaches).
        env = [e["name"] for e in worker["env"]]
        assert env.index("POD_IP") < env.index("VLLM_NIXL_SIDE_CHANNEL_HOST")
        assert env_of(worker)["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$(POD_IP)"
        ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
        assert ports["nixl"] == int(env_of(worker)["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        assert ports["metrics"] == int(template["metadata"]["annotations"]["prometheus.io/port"])
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == "models")
        assert volume["persistentVolumeClaim"]["claimName"] == "meshfront-models"


def test_the_gpu_pools_bring_their_volume_and_replace_the_aggregated_mockers():
    resources = with_component(DISAGG_VLLM)
    claims = {r["metadata"]["name"] for r in resources if r["kind"] == "PersistentVolumeClaim"}
    assert "meshfront-models" in claims
    deployments = {w["metadata"]["name"]: w for w in workloads(resources)}
    assert deployments["mocker"]["spec"]["replicas"] == 0
    [router] = containers(deployments["router"], init=False)
    assert env_of(router)["MESHFRONT_ROUTER_ROUTER_MODE"] == "kv"


# -- components/disagg-sglang: the GPU pools on SGLang ------------------------------------------------------

DISAGG_SGLANG = K8S / "components" / "disagg-sglang"
BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port


def sglang_pools() -> dict[str, dict]:
    return {w["metadata"]["name"]: w for w in workloads(with_component(DISAGG_SGLANG))
            if ROLE_LABEL in w["spec"]["template"]["metadata"]["labels"]}


def on_a_local_model(container: dict, model_dir) -> list[str]:
    """The container's arguments with its model directory (on the pod's volume) swapped for a local one holding
    the config.json `meshfront sglang` and SGLang read (no weights: nothing here loads them)."""
    argv = list(container["args"])
    at = argv.index("--model-dir") + 1
    assert argv[at].startswith("/models/"), argv[at]  # on the volume the pod mounts there
    argv[at] = str(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 40960}))
    return argv


def sglang_worker_flags(container: dict, model_dir):
    """What `meshfront sglang` makes of the container's arguments and env (its own parse, which imports no sglang):
    a flag it refuses fails here, naming it."""
    from services.workers.sglang.config import parse_config

    return parse_config(on_a_local_model(container, model_dir), env_of(container))


def test_sglang_prefill_and_decode_pools_scale_alone_on_gpus_and_meet_at_the_prefill_bootstrap(tmp_path):
    pools = sglang_pools()
    assert set(pools) == {"sglang-prefill", "sglang-decode"}
    selectors = [d["spec"]["selector"]["matchLabels"] for d in pools.values()]
    backends = set()
    for name, d in pools.items():
        role = name.removeprefix("sglang-")
        template = d["spec"]["template"]
        labels = template["metadata"]["labels"]
        assert labels[ROLE_LABEL] == role == d["metadata"]["labels"][ROLE_LABEL]
        assert sum(s.items() <= labels.items() for s in selectors) == 1  # each pool's selector is its own
        assert d["spec"]["replicas"] >= 1 and d["spec"]["strategy"]["type"] == "Recreate"
        [worker] = containers(d)
        assert worker["command"] == ["meshfront", "sglang"] and "meshfront-sglang:" in worker["image"]
        cfg = sglang_worker_flags(worker, tmp_path)
        assert cfg.args.disaggregation_mode == role
        assert cfg.args.nats_url == env_of(worker)["MESHFRONT_NATS_URL"]  # the env twins reach the worker too
        help_text = _help("sglang")
        for name_ in env_of(worker):
            if name_.startswith("MESHFRONT_"):
                assert name_ in env_twins(help_text), f"{name}: {name_} is no flag's twin"
        argv = list(cfg.engine_argv)
        backends.add(argv[argv.index("--disaggregation-transfer-backend") + 1])
        tensor_parallel = int(argv[argv.index("--tp-size") + 1])
        resources = worker["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == tensor_parallel
        # The prefill leg names its bootstrap server by the host of the worker's advertised address
        # (services/workers/sglang/main.py), and SGLang binds it on the worker's --host: the pod IP, which the
        # kubelet puts in for $(POD_IP), and every interface.
        advertised = cfg.worker(context_length=32768, block_size=1).advertised_address(9500)
        assert advertised.rsplit(":", 1)[0] == "$(POD_IP)" and cfg.args.host == "0.0.0.0"
        # SGLang's KV manager binds its transfer socket to, and registers, SGLANG_HOST_IP: the pod IP too.
        env = [e["name"] for e in worker["env"]]
        assert env.index("POD_IP") < env.index("SGLANG_HOST_IP")
        assert env_of(worker)["SGLANG_HOST_IP"] == "$(POD_IP)"
        ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
        scraped = int(template["metadata"]["annotations"]["prometheus.io/port"])
        assert ports["metrics"] == cfg.args.metrics_port == scraped
        if role == "prefill":
            # The port the prefill leg names as bootstrap_port is SGLang's resolved one: given, and exposed.
            assert int(argv[argv.index("--disaggregation-bootstrap-port") + 1]) == ports["bootstrap"] == BOOTSTRAP_PORT
        else:
            assert "bootstrap" not in ports  # SGLang starts a bootstrap server on prefill servers only
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == "models")
        assert volume["persistentVolumeClaim"]["claimName"] == "meshfront-models"
    assert len(backends) == 1, f"the pools' transfer backends differ: {backends}"


def test_the_sglang_pools_replace_the_aggregated_mockers_and_every_request_is_split():
    resources = with_component(DISAGG_SGLANG)
    claims = {r["metadata"]["name"] for r in resources if r["kind"] == "PersistentVolumeClaim"}
    assert "meshfront-models" in claims
    deployments = {w["metadata"]["name"]: w for w in workloads(resources)}
    assert deployments["mocker"]["spec"]["replicas"] == 0
    [router] = containers(deployments["router"], init=False)
    env = env_of(router)
    assert env["MESHFRONT_ROUTER_ROUTER_MODE"] == "kv"
    # SGLang's decode server runs no whole request: the router never falls back to aggregated.
    assert env["MESHFRONT_ROUTER_ENFORCE_DISAGG"] == "true"
    assert "MESHFRONT_ROUTER_ROUTER_CONDITIONAL_DISAGG" not in env
    help_text = _help("router")
    for name in env:
        if name.startswith("MESHFRONT_"):
            assert name in env_twins(help_text), f"router: {name} is no flag's twin"


_SERVER_ARGS = """
import json, sys
from services.workers.sglang.config import parse_config
argv, env = json.load(sys.stdin)
server_args = parse_config(argv, env).server_args()
print(json.dumps({k: getattr(server_args, k) for k in ("disaggregation_mode", "disaggregation_transfer_backend",
                  "disaggregation_bootstrap_port", "host", "tp_size", "context_length")}))
"""


@pytest.fixture(scope="module")
def sglang_python() -> str:
    if not ENGINES["sglang"].is_ready():
        message = "the SGLang engine environment is not prepared (make engine-env)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return str(ENGINES["sglang"].python)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_sglang_pools_flags_are_ones_sglangs_own_parser_takes(role, sglang_python, tmp_path):
    """As `meshfront sglang` starts: the engine flags through SGLang's prepare_server_args (.venv-sglang), on a
    model directory with the manifest's context window (no weights: nothing is loaded)."""
    [worker] = containers(sglang_pools()[f"sglang-{role}"])
    argv = on_a_local_model(worker, tmp_path)
    pythonpath = os.pathsep.join([str(ROOT), str(ROOT / "gen" / "python")])
    out = subprocess.run([sglang_python, "-c", _SERVER_ARGS], input=json.dumps([argv, env_of(worker)]), text=True,
                         capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": pythonpath})
    assert out.returncode == 0, out.stderr[-4000:]
    server_args = json.loads(out.stdout.strip().splitlines()[-1])
    assert server_args["disaggregation_mode"] == role
    assert server_args["disaggregation_transfer_backend"] == "nixl"
    assert (server_args["tp_size"], server_args["context_length"]) == (1, 32768)
    if role == "prefill":  # its bootstrap server: on every interface, at the port the pod exposes
        assert (server_args["host"], server_args["disaggregation_bootstrap_port"]) == ("0.0.0.0", BOOTSTRAP_PORT)
