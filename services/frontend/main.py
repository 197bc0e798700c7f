"""``meshfront frontend``: the frontend tier alone, against the NATS its workers registered in.

What ``python -m dynamo.frontend`` is to Dynamo: Envoy plus the all-in-one process (``--split``: the gateway,
preprocessor, router and postprocessor as processes of their own), supervised as ``meshfront run``
supervises them, with no NATS and no workers of its own: the workers come from discovery. NATS is
``--nats-url``, else Dynamo's ``NATS_SERVER``, else ``nats://127.0.0.1:4222``. The processes behind Envoy
listen on free loopback ports, so a frontend runs beside a ``meshfront run`` on one machine.

``--check-config`` prints the resolved configuration and exits 0; ``--dump-config-to FILE`` writes it as JSON
and goes on; ``-i`` chats on the terminal (services/frontend/interactive.py) while the processes log to a
file. A bad flag or value exits 2 with one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sys
import tempfile
import threading
from collections.abc import Sequence

from services.frontend.config import CHAT_PROCESSORS, PROG, ConfigError, FrontendConfig, as_json, describe, parse
from services.launcher import edge
from services.launcher.plan import MeshPlan, ProcessSpec, free_port, specs
from services.launcher.supervise import RestartPolicy, Spec, Supervisor

# The edge first (no new requests), then the stages; the frontend owns no workers and no NATS.
STOP_ORDER = (("envoy", "gateway-*"), ("preprocessor", "preprocessor-*", "router", "router-*", "postprocessor",
                                        "postprocessor-*"))


def plan_for(cfg: FrontendConfig, run_dir: pathlib.Path) -> MeshPlan:
    """The processes: Envoy on --http-host:--http-port, the rest on free loopback ports, NATS not started."""
    split = cfg.split or cfg.dyn_preprocess_workers > 0 or cfg.dyn_chat_processor != "dynamo"
    chat_processor = ["--chat-processor", CHAT_PROCESSORS[cfg.dyn_chat_processor]]
    service_args = {stage: tuple(cfg.stage_argv(stage)) for stage in ("gateway", "preprocessor", "router",
                                                                        "postprocessor")}
    if not split:  # the all-in-one process takes every stage's flags once (plan.allinone_stage_args)
        service_args = {"gateway": tuple(cfg.stage_argv("allinone"))}
    else:
        service_args["preprocessor"] += tuple(chat_processor)
        service_args["postprocessor"] += tuple(chat_processor)
    gateway_metrics = cfg.grpc_metrics_port if cfg.kserve_grpc_server else cfg.metrics_port
    preprocessors = max(cfg.dyn_preprocess_workers, 1)
    return MeshPlan(http_port=cfg.http_port, http_host=edge.listen_address(cfg.http_host), admin_port=free_port(),
                    external_nats_url=cfg.nats_url, gateway_ports=[free_port()], preprocessor_port=free_port(),
                    router_port=free_port(), postprocessor_port=free_port(), router_mode=cfg.router_mode,
                    inproc=not split, run_dir=run_dir, log_level=cfg.log_level, namespace=cfg.namespace,
                    tls_cert=cfg.tls_cert_path, tls_key=cfg.tls_key_path, tls_client_ca=cfg.tls_client_ca_cert_path,
                    service_args=service_args, preprocessors=preprocessors,
                    extra_preprocessor_ports=[free_port() for _ in range(preprocessors - 1)],
                    metrics_ports={"gateway-0": gateway_metrics} if gateway_metrics else {})


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = parse(argv)
    except ConfigError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if cfg.check_config:
        print(describe(cfg))
        return 0
    if cfg.dump_config_to:
        pathlib.Path(cfg.dump_config_to).write_text(json.dumps(as_json(cfg), indent=2, default=str) + "\n")
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="meshfront-frontend-"))
    process_specs = specs(plan_for(cfg, run_dir))
    if cfg.interactive:
        return _interactive(cfg, process_specs, run_dir)
    supervisor = _supervisor(process_specs)
    print(f"{PROG}: serving on {'https' if cfg.tls_cert_path else 'http'}://{cfg.http_host}:{cfg.http_port} "
          f"with the workers registered in {cfg.nats_url}", flush=True)
    return asyncio.run(supervisor.run())


def _supervisor(process_specs: list[ProcessSpec], out=None) -> Supervisor:
    return Supervisor([Spec(s.name, s.argv, {**os.environ, **s.env}) for s in process_specs], RestartPolicy(),
                      stop_order=STOP_ORDER, adopt_orphans=True, out=out)


def _interactive(cfg: FrontendConfig, process_specs: list[ProcessSpec], run_dir: pathlib.Path) -> int:
    """The processes in the background (their logs in a file), the chat on this terminal; EOF or /exit ends both."""
    from services.frontend.interactive import chat

    log_path = run_dir / "frontend.log"
    with log_path.open("a") as log:
        supervisor = _supervisor(process_specs, out=log)

        async def run() -> int:
            task = asyncio.create_task(supervisor.run())
            url = edge.local_url("https" if cfg.tls_cert_path else "http", cfg.http_host, cfg.http_port)
            done = threading.Event()  # the processes stopped (a crash loop): waiting for a model ends
            task.add_done_callback(lambda _: done.set())
            try:
                code = await asyncio.to_thread(chat, url, cfg.model_name or None, sys.stdin, sys.stdout, done,
                                               f"(process logs: {log_path})")
            finally:
                supervisor.request_stop("the chat ended")
            await task
            return code

        return asyncio.run(run())
