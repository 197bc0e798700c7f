"""components/disagg: prefill and decode pools, each its own Deployment and scaling, with their role on the
worker's flag and on the pods' labels (what Prometheus labels their series with)."""

from __future__ import annotations

import json

import pytest

from services.common.flags import FlagParser
from services.workers.config import DISAGGREGATION_MODES, add_worker_flags
from tests.deploy.test_k8s import K8S, _help, containers, env_of, with_component, workloads

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
                assert f"[env {name_};" in help_text, f"{name}: {name_} is no flag's twin"


def test_the_aggregated_workers_give_way_and_the_router_routes_by_cache():
    deployments = _deployments()
    assert deployments["mocker"]["spec"]["replicas"] == 0
    [router] = containers(deployments["router"], init=False)
    assert env_of(router)["MESHFRONT_ROUTER_ROUTER_MODE"] == "kv"
    assert "[env MESHFRONT_ROUTER_ROUTER_CONDITIONAL_DISAGG;" in _help("router")


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
