"""components/disagg: prefill and decode pools, each its own Deployment and scaling, with their role on the
worker's flag and on the pods' labels (what Prometheus labels their series with)."""

from __future__ import annotations

import pytest

from services.workers.config import DISAGGREGATION_MODES
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
