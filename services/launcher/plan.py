"""What the local mesh consists of: one process spec per service, ports decided up front.

``meshfront run`` hands these specs to its supervisor (supervise.py); the mesh tests start the very
same specs, so what a newcomer runs is what the tests exercise.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import random
import socket
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence

from services.common.namespace import DEFAULT as DEFAULT_NAMESPACE
from services.gateway.extensions.edge import edge_routes
from services.launcher import envoy_config
from services.launcher.engine_env import ENGINES

ROOT = envoy_config.ROOT
VENV_BIN = pathlib.Path(sys.executable).parent


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: list[str]
    # Port that answers once the process is ready (TCP connect).
    ready_port: int
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    model_dir: str
    model_name: str
    kind: str = "mocker"  # mocker | hf | vllm | sglang | embed | diffusers
    extra: tuple[str, ...] = ()


WORKER_MODULES = {"mocker": "services.workers.mocker", "hf": "services.workers.hf", "vllm": "services.workers.vllm",
                  "sglang": "services.workers.sglang", "embed": "services.workers.embed",
                  "diffusers": "services.workers.diffusers",
                  # not a worker: the registrar of stock engines (meshfront run --engine-grpc), placed like one
                  "attach": "services.workers.attach"}


# The kinds whose engine has a prefix cache and publishes its KV events (their --no-kv-events: workers/config.py).
KV_EVENT_KINDS = ("mocker", "vllm", "sglang")


def worker_argv(kind: str, *args: str) -> list[str]:
    """A worker's command line; an engine worker runs from its engine environment's python."""
    python = str(ENGINES[kind].python) if kind in ENGINES else sys.executable
    return [python, "-m", WORKER_MODULES[kind], *args]


def chat_processor_engine(args: Sequence[str]) -> str | None:
    """The engine environment a preprocessor or postprocessor runs from: the one its ``--chat-processor`` names
    (an engine's renderer or parsers import the engine); None for ours."""
    value = None
    for i, arg in enumerate(args):
        if arg == "--chat-processor" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--chat-processor="):
            value = arg.split("=", 1)[1]
    return value if value in ENGINES else None


@dataclasses.dataclass
class MeshPlan:
    http_port: int = 8000
    admin_port: int = 9901
    nats_port: int = 4222
    gateway_ports: list[int] = dataclasses.field(default_factory=lambda: [9100])
    preprocessor_port: int = 9200
    router_port: int = 9300
    postprocessor_port: int = 9400
    worker_ports: list[int] = dataclasses.field(default_factory=list)
    workers: list[WorkerSpec] = dataclasses.field(default_factory=list)
    router_mode: str = "round-robin"
    # The all-in-one shape: each gateway process is services.allinone (preprocessor, router and
    # postprocessor in-process, each honouring its own service_args).
    inproc: bool = False
    run_dir: pathlib.Path = ROOT / ".run"
    log_level: str = "INFO"
    # PEM certificate and key: Envoy's listener speaks TLS (HTTP and gRPC) instead of cleartext.
    tls_cert: str = ""
    tls_key: str = ""
    # PEM CA (with tls_cert): the listener requires a client certificate it signed (``--tls-client-ca``).
    tls_client_ca: str = ""
    # Preprocessor replicas: the gateway spreads calls over all of them. Replicas after the first listen on
    # extra_preprocessor_ports (default: the ports right after preprocessor_port).
    preprocessors: int = 1
    extra_preprocessor_ports: list[int] = dataclasses.field(default_factory=list)
    # Router replicas: the gateway and the postprocessor spread calls over all of them. Replicas
    # after the first listen on extra_router_ports (default: the ports right after router_port).
    routers: int = 1
    extra_router_ports: list[int] = dataclasses.field(default_factory=list)
    # Postprocessor replicas, likewise: the gateway keeps one multiplexed stream to each.
    postprocessors: int = 1
    extra_postprocessor_ports: list[int] = dataclasses.field(default_factory=list)
    # Extra flags per service name ("router", "postprocessor", "gateway", "preprocessor"); in the
    # all-in-one shape every stage's go to each all-in-one process (services/allinone/config.py).
    service_args: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # (CA, certificate, key) PEM paths: mTLS between all services, Envoy included as the gateway's
    # client. mtls_certs gives a service ("gateway", "router", "router-1", "mocker-0", "envoy", ...)
    # its own (certificate, key) instead of the shared one.
    mtls: tuple[str, str, str] | None = None
    mtls_certs: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # Prometheus port per process name ("gateway-0", "router", "mocker-1", ...); absent = off.
    metrics_ports: dict[str, int] = dataclasses.field(default_factory=dict)
    # NATS nodes: 1, or a JetStream cluster (3) whose buckets get three replicas (services/common/
    # jetstream_replicas.py). Nodes after the first listen on extra_nats_ports (default: the ports right after
    # nats_port); each node's cluster routes listen on nats_route_ports (default 6222, 6223, ...).
    nats_cluster: int = 1
    extra_nats_ports: list[int] = dataclasses.field(default_factory=list)
    nats_route_ports: list[int] = dataclasses.field(default_factory=list)
    # An OTLP/gRPC collector ("http://127.0.0.1:4317"): every process and Envoy send it their spans (tracing on).
    otlp_endpoint: str = ""
    # A NATS the plan does not start (``meshfront frontend`` joins the one its workers registered in): every
    # process gets this URL and ``specs`` starts no nats-server.
    external_nats_url: str = ""
    # The address Envoy's listener binds (``--http-host``); the processes behind it stay on loopback.
    http_host: str = "127.0.0.1"
    # Every process's --namespace (services/common/namespace.py): two plans on one NATS (external_nats_url)
    # with different namespaces see none of each other's workers, events or stored objects.
    namespace: str = DEFAULT_NAMESPACE

    def process_flags(self, name: str) -> list[str]:
        """Flags the plan gives the process called ``name``: its metrics port and the --tls-* set."""
        flags = ["--metrics-port", str(self.metrics_ports[name])] if name in self.metrics_ports else []
        if self.mtls is not None:
            ca, cert, key = self.mtls
            cert, key = self.mtls_certs.get(name, (cert, key))
            flags += ["--tls-ca", ca, "--tls-cert", cert, "--tls-key", key]
        return flags

    @property
    def routes_by_kv_events(self) -> bool:
        """Whether a router may read the workers' KV events and load reports: only a kv router does. A --router-mode
        among the stages' own flags may say kv, so it counts as one."""
        stage_flags = [a for name in ALLINONE_STAGES for a in self.service_args.get(name, ())]
        return self.router_mode == "kv" or any(a.split("=", 1)[0] == "--router-mode" for a in stage_flags)

    def worker_flags(self, w: WorkerSpec) -> list[str]:
        """What the plan adds to a worker's own flags (which come after, and so win): --no-kv-events when no router
        reads them. Publishing them cost the frontend side a fifth of its CPU per request on the same vLLM engine
        (bench/RESULTS.md, "Same engine"), and the engine's own publisher thread too."""
        return ["--no-kv-events"] if w.kind in KV_EVENT_KINDS and not self.routes_by_kv_events else []

    def service_names(self) -> list[str]:
        """Names of the Meshfront processes ``specs`` starts (not NATS or Envoy)."""
        names = [f"{w.kind}-{i}" for i, w in enumerate(self.workers)]
        if not self.inproc:
            names += [*_replica_names("preprocessor", self.preprocessors), *_replica_names("router", self.routers),
                      *_replica_names("postprocessor", self.postprocessors)]
        return names + [f"gateway-{i}" for i in range(len(self.gateway_ports))]

    @property
    def preprocessor_ports(self) -> list[int]:
        return _replica_ports(self.preprocessor_port, self.extra_preprocessor_ports, self.preprocessors)

    @property
    def preprocessor_target(self) -> str:
        """One address, or every replica as an ``ipv4:`` list (round-robin in the gateway)."""
        return _target(self.preprocessor_ports)

    @property
    def router_ports(self) -> list[int]:
        return _replica_ports(self.router_port, self.extra_router_ports, self.routers)

    @property
    def router_target(self) -> str:
        """One address, or every replica as a gRPC ``ipv4:`` list (round-robin in the clients)."""
        return _target(self.router_ports)

    @property
    def postprocessor_ports(self) -> list[int]:
        return _replica_ports(self.postprocessor_port, self.extra_postprocessor_ports, self.postprocessors)

    @property
    def postprocessor_target(self) -> str:
        """One address, or every replica as an ``ipv4:`` list (a multiplexed stream to each)."""
        return _target(self.postprocessor_ports)

    @property
    def tls(self) -> tuple[str, str] | None:
        return (self.tls_cert, self.tls_key) if self.tls_cert else None

    @property
    def nats_ports(self) -> list[int]:
        return _replica_ports(self.nats_port, self.extra_nats_ports, self.nats_cluster)

    @property
    def nats_names(self) -> list[str]:
        """``nats``, then ``nats-1``, ``nats-2`` for a cluster's other nodes."""
        return _replica_names("nats", self.nats_cluster)

    @property
    def nats_url(self) -> str:
        """Every node's URL: a client fails over to another node when its own goes away."""
        if self.external_nats_url:
            return self.external_nats_url
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.nats_ports)

    @property
    def nats_dirs(self) -> list[pathlib.Path]:
        """Each node's JetStream store."""
        return [self.run_dir / f"nats-{p}" for p in self.nats_ports]


_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for port 0 and for outgoing connections' source ports."""
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


# Ports handed out by any process on this machine: one file each, created exclusively (services/launcher/plan.py
# ``free_port``). A reservation outlives the bind it was for by far; one this old is anybody's again.
RESERVATIONS = pathlib.Path(tempfile.gettempdir()) / "meshfront-ports"
RESERVATION_S = 600.0


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range, reserved for this caller machine-wide.

    The port is bound only later, by the process it is given to. A port from the ephemeral range (what
    binding port 0 returns) can be taken in between by any process's outgoing connection or port-0
    bind, which failed whole test meshes with "Address already in use"; below the range only another
    free_port caller could take it. This process never hands the same port out twice, and a reservation file
    keeps other processes (test tiers side by side, launchers, frontends) from handing it out meanwhile.
    """
    low = _ephemeral_range()[0]
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, low)
        if port in _HANDED_OUT or not _reserve(port):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free loopback port between 10000 and {low}")


def _reserve(port: int) -> bool:
    """Claims ``port`` for this process unless another claimed it less than RESERVATION_S ago."""
    RESERVATIONS.mkdir(mode=0o777, exist_ok=True)
    path = RESERVATIONS / str(port)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        return True
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < RESERVATION_S:
                return False
            os.utime(path)  # stale: ours now (two takers of one stale file both may bind-check it; rare)
            return True
        except OSError:
            return False


def ephemeral_plan(workers: list[WorkerSpec], gateways: int = 1, **kw) -> MeshPlan:
    """A plan on free ports, for tests and benchmarks that must not clash with a running mesh."""
    kw.setdefault("extra_preprocessor_ports", [free_port() for _ in range(kw.get("preprocessors", 1) - 1)])
    kw.setdefault("extra_router_ports", [free_port() for _ in range(kw.get("routers", 1) - 1)])
    kw.setdefault("extra_postprocessor_ports", [free_port() for _ in range(kw.get("postprocessors", 1) - 1)])
    kw.setdefault("extra_nats_ports", [free_port() for _ in range(kw.get("nats_cluster", 1) - 1)])
    kw.setdefault("nats_route_ports", [free_port() for _ in range(kw.get("nats_cluster", 1))]
                  if kw.get("nats_cluster", 1) > 1 else [])
    plan = MeshPlan(http_port=free_port(), admin_port=free_port(), nats_port=free_port(),
                    gateway_ports=[free_port() for _ in range(gateways)], preprocessor_port=free_port(),
                    router_port=free_port(), postprocessor_port=free_port(),
                    worker_ports=[free_port() for _ in workers], workers=workers, **kw)
    if "metrics_ports" not in kw:  # every service scrapeable, as on Kubernetes
        plan.metrics_ports = {name: free_port() for name in plan.service_names()}
    return plan


def nats_specs(plan: MeshPlan) -> list[ProcessSpec]:
    """One nats-server, or a JetStream cluster's nodes, each routed to every other one."""
    nodes = zip(plan.nats_names, plan.nats_ports, plan.nats_dirs, strict=True)
    if plan.nats_cluster == 1:
        return [ProcessSpec(name, [str(VENV_BIN / "nats-server"), "-js", "-a", "127.0.0.1", "-p", str(port),
                                   "-sd", str(store)], port) for name, port, store in nodes]
    routes = plan.nats_route_ports or [6222 + i for i in range(plan.nats_cluster)]
    urls = [f"nats://127.0.0.1:{p}" for p in routes]
    return [ProcessSpec(name, [str(VENV_BIN / "nats-server"), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd",
                               str(store), "-n", name, "--cluster_name", "meshfront", "--cluster", urls[i],
                               "--routes", ",".join(u for u in urls if u != urls[i])], port)
            for i, (name, port, store) in enumerate(nodes)]


def _replica_names(service: str, count: int) -> list[str]:
    """``router``, ``router-1``, ...: the first replica keeps the plain name."""
    return [service if i == 0 else f"{service}-{i}" for i in range(count)]


def _replica_ports(first: int, extra: list[int], count: int) -> list[int]:
    """The first replica's port, then the extra ones (default: the ports right after the first)."""
    return [first, *(extra or [first + i for i in range(1, count)])[:count - 1]]


def _target(ports: list[int]) -> str:
    addrs = [f"127.0.0.1:{p}" for p in ports]
    return addrs[0] if len(addrs) == 1 else "ipv4:" + ",".join(addrs)


def _py(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _otlp_address(endpoint: str) -> tuple[str, int] | None:
    """The collector's (host, port) for Envoy's tracer; None when tracing is off."""
    if not endpoint:
        return None
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    return parsed.hostname or "127.0.0.1", parsed.port or 4317


def _envoy_upstream_tls(plan: MeshPlan) -> tuple[str, str, str] | None:
    if plan.mtls is None:
        return None
    ca, cert, key = plan.mtls
    return (ca, *plan.mtls_certs.get("envoy", (cert, key)))


ALLINONE_STAGES = ("preprocessor", "router", "postprocessor", "gateway")


def allinone_stage_args(plan: MeshPlan) -> list[str]:
    """Every stage's service_args for the all-in-one process, whose flags are all stages' own (one name
    each: services/allinone/config.py resolves the names several services share)."""
    return [a for name in ALLINONE_STAGES for a in plan.service_args.get(name, ())]


def specs(plan: MeshPlan) -> list[ProcessSpec]:
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    common = ["--nats-url", plan.nats_url, "--log-level", plan.log_level, "--namespace", plan.namespace]
    env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if plan.otlp_endpoint:  # spans leave every half second (the SDK's default is 5 s): a trace shows up at once
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=plan.otlp_endpoint, OTEL_BSP_SCHEDULE_DELAY="500")
    out = [] if plan.external_nats_url else nats_specs(plan)
    for i, (w, port) in enumerate(zip(plan.workers, plan.worker_ports, strict=True)):
        out.append(ProcessSpec(f"{w.kind}-{i}", worker_argv(w.kind, "--port", str(port), "--model-dir", w.model_dir,
                                                            "--model-name", w.model_name, *common,
                                                            *plan.worker_flags(w), *w.extra,
                                                            *plan.process_flags(f"{w.kind}-{i}")), port, env))
    renderer_engine = chat_processor_engine(plan.service_args.get("preprocessor", ()))
    parser_engine = chat_processor_engine(plan.service_args.get("postprocessor", ()))
    for stage_name, engine in (("preprocessor", renderer_engine), ("postprocessor", parser_engine)):
        if plan.inproc and engine is not None:
            raise ValueError(f"--chat-processor {engine} for the {stage_name} needs it as its own process "
                             f"(the all-in-one's {stage_name} runs from the mesh's environment)")
    if plan.inproc:
        gateway_module = "services.allinone"
        stage = ["--router-mode", plan.router_mode, *allinone_stage_args(plan)]
    else:
        out += [
            *(ProcessSpec(name, [str(ENGINES[renderer_engine].python) if renderer_engine else sys.executable,
                                 "-m", "services.preprocessor", "--port", str(port), *common,
                                 *plan.service_args.get("preprocessor", ()), *plan.process_flags(name)], port, env)
              for name, port in zip(_replica_names("preprocessor", plan.preprocessors), plan.preprocessor_ports,
                                    strict=True)),
            *(ProcessSpec(name, _py("services.router", "--port", str(port), "--router-mode", plan.router_mode,
                                    *common, *plan.service_args.get("router", ()), *plan.process_flags(name)),
                          port, env)
              for name, port in zip(_replica_names("router", plan.routers), plan.router_ports, strict=True)),
            *(ProcessSpec(name, [str(ENGINES[parser_engine].python) if parser_engine else sys.executable,
                                 "-m", "services.postprocessor", "--port", str(port), "--router", plan.router_target,
                                 *common, *plan.service_args.get("postprocessor", ()), *plan.process_flags(name)],
                          port, env)
              for name, port in zip(_replica_names("postprocessor", plan.postprocessors), plan.postprocessor_ports,
                                    strict=True)),
        ]
        gateway_module = "services.gateway"
        stage = ["--preprocessor", plan.preprocessor_target, "--router",
                 plan.router_target, "--postprocessor", plan.postprocessor_target,
                 *plan.service_args.get("gateway", ())]
    for i, port in enumerate(plan.gateway_ports):
        out.append(ProcessSpec(f"gateway-{i}", _py(gateway_module, "--port", str(port), *common, *stage,
                                                   *plan.process_flags(f"gateway-{i}")), port, env))
    envoy_yaml = plan.run_dir / f"envoy-{plan.http_port}.yaml"
    envoy_yaml.write_text(envoy_config.render(listen_host=plan.http_host, listen_port=plan.http_port,
                                              admin_port=plan.admin_port, tls=plan.tls,
                                              tls_client_ca=plan.tls_client_ca,
                                              upstream_tls=_envoy_upstream_tls(plan),
                                              gateways=[("127.0.0.1", p) for p in plan.gateway_ports],
                                              otlp=_otlp_address(plan.otlp_endpoint),
                                              # the gateways' route extensions (their flags and env twins)
                                              extension_routes=edge_routes(plan.service_args.get("gateway", ()))))
    out.append(ProcessSpec("envoy", [str(VENV_BIN / "envoy"), "-c", str(envoy_yaml), "--concurrency", "1",
                                     "--log-level", "warn", "--base-id", str(plan.http_port)], plan.http_port,
                           {"PATH": os.environ.get("PATH", "")}))
    return out
