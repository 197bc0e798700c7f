"""``meshfront run --engine-grpc ADDR``: stock engines already serving SMG's engine gRPC (``vllm serve --grpc``),
fronted instead of simulated workers.

The run starts no worker of its own for the model; it runs ``meshfront attach`` (services/workers/attach) for the
addresses, as a worker of the plan (so the launcher supervises it and waits for its model like any worker's), and
the engines' cards carry their protocol for the postprocessor (docs/engine-grpc.md).
"""

from __future__ import annotations

import argparse

from services.common.cards import ENGINE_PROTOCOLS
from services.launcher.plan import WorkerSpec


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine-grpc", action="append", default=[], metavar="HOST:PORT",
                   help="an engine serving SMG's engine gRPC (vllm serve --grpc), attached instead of simulated "
                        "workers (repeatable; --model-dir is the engine's model, default the engine's own path)")
    p.add_argument("--engine-protocol", choices=ENGINE_PROTOCOLS, default=ENGINE_PROTOCOLS[0],
                   help="which engine service the --engine-grpc addresses serve")


def check(args: argparse.Namespace) -> None:
    """Before ``_check_roles``: with engines, no simulated worker unless asked for.

    Raises:
        ValueError: a flag that cannot go with --engine-grpc."""
    if not args.engine_grpc:
        return
    if args.prefill_workers or args.decode_workers:
        raise ValueError("--engine-grpc attaches engines that run whole requests: no --prefill-workers or "
                         "--decode-workers beside it")
    if args.mesh_tls_ca or args.mesh_tls_cert or args.mesh_tls_key:
        raise ValueError("--engine-grpc engines are dialled in cleartext: not with --mesh-tls-*")
    if args.workers:
        raise ValueError("--engine-grpc serves the model from the engines: no --workers beside it")
    args.workers = 0


def count(args: argparse.Namespace) -> int:
    """Worker slots (ports) it takes: the registrar's."""
    return 1 if args.engine_grpc else 0


def attach_worker(args: argparse.Namespace, model_dir: str, model_name: str,
                  parser_flags: tuple[str, ...]) -> list[WorkerSpec]:
    """The registrar of the --engine-grpc engines, as a worker of the plan; none without them. ``model_dir`` and
    ``model_name`` may be empty: the engine's."""
    if not args.engine_grpc:
        return []
    targets = tuple(flag for address in args.engine_grpc for flag in ("--engine-grpc", address))
    return [WorkerSpec(model_dir, model_name, "attach",
                       (*targets, "--engine-protocol", args.engine_protocol, *parser_flags))]
