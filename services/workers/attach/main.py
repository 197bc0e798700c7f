"""``meshfront attach``: registers stock engines that serve SMG's engine proto (vLLM ``--grpc``, SGLang ``--grpc-mode``,
TensorRT-LLM ``--grpc``) in the mesh, by address or by a headless Service's DNS name (docs/engine-grpc.md).

Thin: flags -> one ``EngineLink`` per address (link.py) -> until SIGTERM. With ``--engine-dns NAME:PORT`` the name is
looked up again every ``--dns-interval-s``: a new pod's address is attached, a gone one's link closed (its card
purged). A failed lookup changes nothing: the links' health checks drop engines that are really gone.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from collections.abc import Sequence

from services.common import namespace
from services.common.assembly import cancel_within
from services.common.flags import FlagParser
from services.common.grpc_server import GrpcServer, setup_logging
from services.common.metrics import serve_metrics
from services.common.parser_names import REASONING_PARSER_NAMES, TOOL_CALL_PARSER_NAMES
from services.workers.attach.core import (
    PROTOCOLS,
    VLLM_ENGINE,
    AttachSettings,
    address_of,
    split_dns_target,
    target_changes,
)
from services.workers.attach.link import EngineLink

log = logging.getLogger("services.workers.attach")


def _dns_target(value: str) -> str:
    if not value:  # the default (argparse types a string default too)
        return value
    try:
        split_dns_target(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def parser() -> FlagParser:
    p = FlagParser("attach", "register stock engines serving SMG's engine gRPC proto in the mesh")
    p.add("--engine-grpc", default=(), repeatable=True, help="an engine's gRPC address host:port (repeatable)")
    p.add("--engine-dns", default="", type=_dns_target,
          help="NAME:PORT: a headless Service name, looked up again every --dns-interval-s; each address is an engine")
    p.add("--dns-interval-s", default=5.0, type=float, help="how often --engine-dns is looked up again")
    p.add("--engine-protocol", default=VLLM_ENGINE, choices=PROTOCOLS,
          help="which engine service the addresses serve (SMG's proto)")
    p.add("--model-name", default="", help="served model name (default: the engine's)")
    p.add("--model-dir", default="", help="the model's directory here: its tokenizer and chat template go to the "
                                          "mesh (default: the engine's model path)")
    p.add("--block-size", default=0, type=int, help="KV block size in tokens (default: the engine's, where it says)")
    p.add("--tool-call-parser", default="", choices=("", *TOOL_CALL_PARSER_NAMES), aliases=("--dyn-tool-call-parser",),
          help="tool-call parser name to register (e.g. hermes)")
    p.add("--reasoning-parser", default="", choices=("", *REASONING_PARSER_NAMES),
          aliases=("--dyn-reasoning-parser",), help="reasoning parser name to register (e.g. qwen3)")
    p.add("--host", default="127.0.0.1", help="address of its gRPC health service")
    p.add("--port", default=0, type=int, help="port of its gRPC health service (0 picks a free one)")
    p.add("--metrics-port", default=0, type=int, help="Prometheus metrics port (0 = off)")
    p.add("--nats-url", default="nats://127.0.0.1:4222", env="MESHFRONT_NATS_URL", dynamo_env="NATS_SERVER",
          help="NATS server URL, or every node of a cluster comma-separated")
    p.add("--namespace", default=namespace.DEFAULT, type=namespace.namespace_name, env="MESHFRONT_NAMESPACE",
          dynamo_env="DYN_NAMESPACE", help="the namespace the engines register in")
    p.add("--log-level", default="INFO", env="MESHFRONT_LOG_LEVEL", help="logging level")
    return p


def settings_of(args: argparse.Namespace) -> AttachSettings:
    return AttachSettings(protocol=args.engine_protocol, namespace=args.namespace, model_name=args.model_name,
                          model_dir=args.model_dir, block_size=args.block_size,
                          tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser)


def flag_error(args: argparse.Namespace) -> str | None:
    if not args.engine_grpc and not args.engine_dns:
        return "give --engine-grpc ADDR or --engine-dns NAME:PORT"
    if args.block_size < 0:
        return "--block-size must be positive"
    if not 0 <= args.port <= 65535:
        return f"--port {args.port} is not a port number (0..65535)"
    if args.dns_interval_s <= 0:
        return "--dns-interval-s must be positive"
    return None


class Fleet:
    """The links of every attached address."""

    def __init__(self, settings: AttachSettings, nats_url: str):
        self.settings, self.nats_url = settings, nats_url
        self.links: dict[str, EngineLink] = {}

    async def follow(self, addresses: Sequence[str]) -> None:
        added, removed = target_changes(self.links, addresses)
        for address in removed:
            log.info("engine %s left; detaching it", address)
            await self.links.pop(address).close()
        for address in added:
            log.info("attaching the engine at %s", address)
            self.links[address] = EngineLink(address, self.settings, self.nats_url)
            await self.links[address].start()

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links.values()))


async def resolve(target: str) -> list[str] | None:
    """The addresses NAME:PORT stands for now; None when the lookup failed."""
    name, port = split_dns_target(target)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        log.warning("looking up %s failed (%s); keeping the engines attached", name, e)
        return None
    return sorted({address_of(str(info[4][0]), port) for info in infos})


async def follow_targets(args: argparse.Namespace, fleet: Fleet) -> None:
    static = list(args.engine_grpc)
    await fleet.follow(static)
    while args.engine_dns:
        found = await resolve(args.engine_dns)
        if found is not None:
            await fleet.follow(sorted({*static, *found}))
        await asyncio.sleep(args.dns_interval_s)


async def run(args: argparse.Namespace) -> None:
    """Serves gRPC health on --port (a Kubernetes probe; the launcher's sign it started) until SIGTERM, then
    purges every card it keeps."""
    fleet = Fleet(settings_of(args), args.nats_url)
    serve_metrics(args.metrics_port, args.host)
    server = GrpcServer("attach", args.host, args.port, grace_s=0)
    following = asyncio.create_task(follow_targets(args, fleet), name="attach-targets")

    async def stop_following() -> None:
        await cancel_within([following])

    server.on_drain(stop_following)
    server.on_drain(fleet.close)
    await server.serve_until_signal()


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse(argv)
    error = flag_error(args)
    if error is not None:
        print(f"meshfront attach: {error}", file=sys.stderr)
        return 2
    setup_logging(args.log_level)
    asyncio.run(run(args))
    return 0
