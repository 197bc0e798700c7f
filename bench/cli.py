"""Command line: ``python -m bench mesh [options]`` or ``python -m bench load --url URL [options]``.

``mesh`` starts a fresh mesh per shape and tears it down; ``load`` drives a mesh that is already
running (e.g. ``make run``) and accounts CPU for the pids given with ``--pid name=PID``; ``engine``
puts vLLM CPU workers behind the split and inproc meshes and compares them with vLLM's own server
(bench/engine.py); ``kv``, ``vision`` (bench/vision.py), ``soak``, ``embeddings`` (POST /v1/embeddings vs
the model in-process, bench/embeddings.py) and ``images`` (the tiny diffusers pipeline in-process, behind its worker and
through the mesh, bench/images.py) and ``media-transfer`` (MB/s and per-process memory of a ~50 MB video through
Envoy, bench/media_transfer.py) and ``scale`` (each stage at 1, 2 and 4 replicas, each replica a small
host: a network namespace under a CPU quota, bench/scale.py) are described by their own ``--help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shlex
import sys
from pathlib import Path

from bench import cli_fleets, cli_scale, idle, mesh, multiturn, tenants
from bench.cli_common import emit as _emit
from bench.cli_common import ints as _ints
from bench.cli_common import machine_line as _machine_line
from bench.cli_common import speedup as _speedup
from bench.report import LEGEND, Row, markdown_table, text_table

PACED_SPEEDUP = 1.0  # the mocker's real-time pace: a decode step of ~6 ms (empty cache) to ~12 ms (c=128)


def _add_load_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=_ints, default=(1, 8, 32, 128), help="comma list (default 1,8,32,128)")
    p.add_argument("--requests", type=int, default=0, help="requests per level (default max(200, 8*concurrency))")
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--shared-prefix-tokens", type=int, default=0, help="leading prompt tokens every request shares")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=32, help="warm-up requests before the first level")
    p.add_argument("--level-timeout", type=float, default=120.0, help="seconds one level may take at most")
    p.add_argument("--model", default="meshfront/demo-qwen")
    p.add_argument("--idle-seconds", type=float, default=3.0, help="idle-CPU baseline window (0 = skip)")
    p.add_argument("--seed", type=int, default=None, help="prompt PRNG seed (default random)")
    p.add_argument("--markdown", default="", help="append a markdown section with the table to this file")
    p.add_argument("--json", default="", help="write every level's figures to this JSON file")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="scenario", required=True)
    m = sub.add_parser("mesh", help="start a mesh per shape and measure it")
    m.add_argument("--shape", default="split,inproc", help="comma list of split, inproc, dynamo (Dynamo 1.6.1's "
                   "own frontend and mocker, the peer; its environment is built on first use), edge (Envoy and a "
                   "stand-in gateway streaming pre-rendered chunks at the mocker's pace: the floor; every other "
                   "shape's CPU per request is printed as a ratio to it), edge-split (the split shape's hops with "
                   "stand-in stages that do no work: what the hops alone cost over the floor)")
    m.add_argument("--rounds", type=int, default=1, help="run every shape this many times, interleaved (edge, "
                   "split, edge, split, ...), and print each round's ratios to its own floor and their median: one "
                   "run's ratio moves by a fifth on a shared machine")
    m.add_argument("--speedup", type=_speedup, default=100.0, help="mocker --speedup-ratio; 'instant' = 0")
    m.add_argument("--paced", action="store_true", help=f"mocker at real pace (speed-up {PACED_SPEEDUP:g})")
    m.add_argument("--workers", type=int, default=2)
    m.add_argument("--gateways", type=int, default=1, help="gateway processes behind Envoy (all-in-one "
                   "processes in the inproc shape)")
    m.add_argument("--router-mode", default="round-robin")
    m.add_argument("--worker-flag", action="append", default=[], help="extra mocker flag (repeatable), e.g. "
                   "--worker-flag=--num-gpu-blocks=4096")
    m.add_argument("--postprocessor-flag", action="append", default=[], help="extra postprocessor flag "
                   "(repeatable), e.g. --postprocessor-flag=--stream-idle-timeout-s=0")
    m.add_argument("--gateway-flag", action="append", default=[], help="extra gateway flag (repeatable, both "
                   "shapes), e.g. --gateway-flag=--stream-interval=4")
    m.add_argument("--log-level", default="WARNING", help="log level of the mesh services")
    m.add_argument("--otlp-endpoint", default="", help="tracing on: the OTLP/gRPC collector every process and Envoy "
                   "send spans to (e.g. http://127.0.0.1:4317); default off")
    m.add_argument("--profile", default="", metavar="DIR", help="py-spy every measured level of the processes "
                   "--profile-process names; collapsed stacks go to DIR, top frames are printed")
    m.add_argument("--profile-process", type=lambda t: tuple(x for x in t.split(",") if x),
                   default=("gateway", "postprocessor"), help="comma list of launcher names (default gateway,"
                   "postprocessor; gateway matches gateway-0)")
    m.add_argument("--profile-native", action="store_true", help="sample C and Cython frames too (grpc's core, "
                   "uvloop): slower to record")
    _add_load_flags(m)
    ld = sub.add_parser("load", help="drive a running mesh")
    ld.add_argument("--url", required=True, help="Envoy's base URL, e.g. http://127.0.0.1:8000")
    ld.add_argument("--pid", action="append", default=[], help="NAME=PID to account CPU for (repeatable); names as the "
                    "launcher gives them: envoy, gateway-0, preprocessor, router, postprocessor, mocker-0, nats")
    _add_load_flags(ld)
    _add_kv_parser(sub)
    _add_vision_parser(sub)
    _add_soak_parser(sub)
    _add_engine_parser(sub)
    _add_embeddings_parser(sub)
    _add_tokenizers_parser(sub)
    cli_fleets.add_images_parser(sub)
    cli_fleets.add_disagg_parser(sub)
    cli_fleets.add_media_transfer_parser(sub)
    multiturn.add_parser(sub)
    cli_scale.add_scale_parser(sub)
    tenants.add_parser(sub)
    idle.add_parser(sub)
    args = p.parse_args(argv)
    if args.scenario == "engine":
        from bench.engine import DEPLOYMENTS

        args.deployments = tuple(s.strip() for s in args.deployments.split(",") if s.strip())
        bad = [s for s in args.deployments if s not in DEPLOYMENTS]
        if bad or not args.deployments:
            p.error(f"unknown deployment(s) {bad}; choose from {DEPLOYMENTS}")
    if args.scenario == "kv":
        from bench.kv import SHAPES as KV_SHAPES

        args.shape = tuple(s.strip() for s in args.shape.split(",") if s.strip())
        bad = [s for s in args.shape if s not in KV_SHAPES]
        if bad or not args.shape:
            p.error(f"unknown shape(s) {bad}; choose from {KV_SHAPES}")
    if args.scenario == "mesh":
        args.shape = tuple(s.strip() for s in args.shape.split(",") if s.strip())
        known = (*mesh.SHAPES, mesh.PEER, mesh.FLOOR, mesh.SPLIT_FLOOR)
        bad = [s for s in args.shape if s not in known]
        if bad:
            p.error(f"unknown shape(s) {bad}; choose from {known}")
        if args.rounds < 1:
            p.error("--rounds must be at least 1")
        if args.paced:
            args.speedup = PACED_SPEEDUP
    return args


def _add_kv_parser(sub) -> None:
    from bench.kv import KvBenchConfig

    d = KvBenchConfig()
    k = sub.add_parser("kv", help="KV-aware routing vs round-robin / least-loaded on prefix-sharing load")
    k.add_argument("--cases", default="groups,flood,unique,replicas", help="comma list of groups, flood, unique, "
                   "replicas")
    k.add_argument("--requests", type=int, default=d.requests)
    k.add_argument("--concurrency", type=int, default=d.concurrency)
    k.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks, help="KV cache of each mocker")
    k.add_argument("--workers", type=int, default=d.workers)
    k.add_argument("--max-tokens", type=int, default=d.max_tokens)
    k.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    k.add_argument("--speedup", type=_speedup, default=d.speedup, help="mocker --speedup-ratio (default 1 = paced)")
    k.add_argument("--shape", default=",".join(d.shapes), help="comma list of split, inproc (the all-in-one "
                   "process); each case runs in each shape (replicas: split only)")
    k.add_argument("--markdown", default="", help="append the table to this file")


def _add_vision_parser(sub) -> None:
    from bench.vision import VisionBenchConfig

    d = VisionBenchConfig()
    v = sub.add_parser("vision", help="cached share of repeated images vs text on the same prefix structure, kv "
                       "routing over image-declaring mockers")
    v.add_argument("--requests", type=int, default=d.requests)
    v.add_argument("--concurrency", type=int, default=d.concurrency)
    v.add_argument("--workers", type=int, default=d.workers)
    v.add_argument("--groups", type=int, default=d.groups)
    v.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks, help="KV cache of each mocker")
    v.add_argument("--speedup", type=_speedup, default=d.speedup, help="mocker --speedup-ratio")
    v.add_argument("--markdown", default="", help="append the table to this file")


def _run_vision(args: argparse.Namespace, command: str) -> int:
    from bench.vision import VisionBenchConfig, run

    cfg = VisionBenchConfig(requests=args.requests, concurrency=args.concurrency, workers=args.workers,
                            groups=args.groups, num_gpu_blocks=args.num_gpu_blocks, speedup=args.speedup)
    started = datetime.datetime.now().astimezone()
    _emit(f"# {started:%Y-%m-%d %H:%M %Z}; {_machine_line()}; {cfg}")
    table = run(cfg, _emit)
    _emit("\n" + table)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {_machine_line()}.\n"
                    f"Setting: {cfg}.\n\n{table}\n")
    return 0


def _add_soak_parser(sub) -> None:
    from bench.soak import SoakConfig

    d = SoakConfig()
    s = sub.add_parser("soak", help="closed-loop load for N minutes on a fresh mesh, sampling every process's RSS")
    s.add_argument("--minutes", type=float, default=d.minutes)
    s.add_argument("--warmup-minutes", type=float, default=d.warmup_minutes, help="growth is measured after this")
    s.add_argument("--concurrency", type=int, default=d.concurrency)
    s.add_argument("--max-tokens", type=int, default=d.max_tokens)
    s.add_argument("--workers", type=int, default=d.workers)
    s.add_argument("--speedup", type=_speedup, default=d.speedup, help="mocker --speedup-ratio (default 1 = paced)")
    s.add_argument("--sample-seconds", type=float, default=d.sample_s)
    s.add_argument("--shape", default=d.shape, choices=mesh.SHAPES)
    s.add_argument("--markdown", default="", help="append the table to this file")
    s.add_argument("--json", default="", help="write every RSS sample (KiB per process) and the counts to this file")


def _add_embeddings_parser(sub) -> None:
    from bench.embeddings import SHAPES as EMBED_SHAPES
    from bench.embeddings import EmbedBenchConfig

    d = EmbedBenchConfig()
    e = sub.add_parser("embeddings", help="POST /v1/embeddings through a fresh mesh (one all-MiniLM-L6-v2 worker) "
                       "vs the same model called in-process")
    e.add_argument("--shape", default=",".join(d.shapes), help=f"comma list of {', '.join(EMBED_SHAPES)}")
    e.add_argument("--concurrency", type=_ints, default=d.concurrency, help="comma list (default 1,8,32)")
    e.add_argument("--requests", type=int, default=0, help="requests per level (default max(100, 8*c))")
    e.add_argument("--words", type=int, default=d.words, help="words per input sentence")
    e.add_argument("--warmup", type=int, default=d.warmup, help="warm-up requests before each level")
    e.add_argument("--no-direct", action="store_true", help="skip the in-process baseline")
    e.add_argument("--threads", type=int, default=d.threads, help="torch threads of the worker and the baseline")
    e.add_argument("--log-level", default=d.log_level, help="log level of the mesh services")
    e.add_argument("--markdown", default="", help="append a markdown section with the table to this file")


def _add_tokenizers_parser(sub) -> None:
    t = sub.add_parser("tokenizers", help="prompt encoding: fastokens (--tokenizer fastokens) vs the tokenizers "
                       "library, in this process, on the demo model and the tiny tiktoken model")
    t.add_argument("--prompts", type=int, default=2000, help="prompts per measurement")
    t.add_argument("--words", type=int, default=200, help="words per prompt")
    t.add_argument("--repeats", type=int, default=1, help="passes; the best is reported (later passes hit both "
                   "libraries' per-word caches, fastokens' far more: 1 is the cold figure)")
    t.add_argument("--markdown", default="", help="append a markdown section with the table to this file")


def _run_tokenizers(args: argparse.Namespace, command: str) -> int:
    import tempfile

    from bench import tokenizers
    from services.models.build import default_test_model_dir
    from services.models.tokenizer_models import build_tokenizer_model

    started = datetime.datetime.now().astimezone()
    _emit(f"# {started:%Y-%m-%d %H:%M %Z}; {_machine_line()}")
    with tempfile.TemporaryDirectory(prefix="bench-tokenizers-") as tmp:
        models = [default_test_model_dir(), build_tokenizer_model("tiktoken", Path(tmp) / "tiny-kimi")]
        table = tokenizers.run(models, args.prompts, args.words, args.repeats, _emit)
    _emit("\n" + table + "\n\n" + tokenizers.LEGEND)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {_machine_line()}.\n\n{table}\n\n"
                    f"{tokenizers.LEGEND}\n")
    return 0


def _run_embeddings(args: argparse.Namespace, command: str) -> int:
    import tempfile

    from bench import embeddings

    shapes = tuple(s.strip() for s in args.shape.split(",") if s.strip())
    bad = [s for s in shapes if s not in embeddings.SHAPES]
    if bad:
        raise SystemExit(f"unknown shape(s) {bad}; choose from {embeddings.SHAPES}")
    cfg = embeddings.EmbedBenchConfig(shapes=shapes, concurrency=args.concurrency, requests=args.requests or None,
                                      words=args.words, warmup=args.warmup, direct=not args.no_direct,
                                      log_level=args.log_level, threads=args.threads)
    started = datetime.datetime.now().astimezone()
    _emit(f"# {started:%Y-%m-%d %H:%M %Z}; {_machine_line()}")
    with tempfile.TemporaryDirectory(prefix="bench-embeddings-") as logs:
        rows = embeddings.run(cfg, _emit, Path(logs))
    table = embeddings.markdown_table(rows)
    _emit("\n" + table + "\n\n" + embeddings.LEGEND)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {_machine_line()}.\n"
                    f"Setting: {cfg}.\n\n{table}\n\n{embeddings.LEGEND}\n")
    return 0


def _add_engine_parser(sub) -> None:
    from bench.engine import DEPLOYMENTS, EngineBenchConfig

    d = EngineBenchConfig()
    e = sub.add_parser("engine", help="vLLM CPU workers behind the split and inproc meshes vs vLLM's own OpenAI "
                       "server, same model and load")
    e.add_argument("--deployments", default=",".join(d.deployments), help=f"comma list of {', '.join(DEPLOYMENTS)} "
                   "(vllm = vLLM's own server; grpc = the all-in-one mesh over `vllm serve --grpc`, smg = SMG 1.13 "
                   "over it)")
    e.add_argument("--concurrency", type=_ints, default=d.concurrency, help="comma list (default 8,32)")
    e.add_argument("--requests", type=int, default=0, help="requests per level (default max(96, 4*concurrency))")
    e.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    e.add_argument("--max-tokens", type=int, default=d.max_tokens, help="tokens out; also sent as min_tokens")
    e.add_argument("--warmup", type=int, default=d.warmup, help="warm-up requests per deployment (discarded)")
    e.add_argument("--workers", type=int, default=d.workers, help="vLLM workers behind each mesh (default 1; "
                   "vLLM's server is always one engine)")
    e.add_argument("--engine-flag", action="append", default=[], help="extra vLLM engine flag for the workers and "
                   "the server alike (repeatable), e.g. --engine-flag=--max-num-seqs=64")
    e.add_argument("--level-timeout", type=float, default=d.level_timeout_s, help="seconds one level may take at most")
    e.add_argument("--start-timeout", type=float, default=d.start_timeout_s, help="seconds a deployment may take "
                   "to start")
    e.add_argument("--idle-seconds", type=float, default=d.idle_s, help="idle-CPU window after warm-up (0 = skip)")
    e.add_argument("--model", default=d.model_name, help="served model name")
    e.add_argument("--seed", type=int, default=None, help="prompt PRNG seed (default random, one for the run)")
    e.add_argument("--log-level", default=d.log_level, help="log level of the mesh services")
    e.add_argument("--markdown", default="", help="append a markdown section with the table to this file")
    e.add_argument("--json", default="", help="write every level's figures to this JSON file")
    e.add_argument("--vision", action="store_true", help="the demo vision model (meshfront/demo-qwen-vl), a distinct "
                   "224x224 image per request, Qwen2-VL's engine flags (services/launcher/media_demos.py)")


def _run_engine(args: argparse.Namespace, command: str) -> int:
    from bench import engine, engine_grpc
    from services.launcher.media_demos import VISION
    from services.models.qwen_vl import NAME as VISION_MODEL

    cfg = engine.EngineBenchConfig(
        deployments=args.deployments, concurrency=args.concurrency, requests=args.requests or None,
        prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, warmup=args.warmup, workers=args.workers,
        level_timeout_s=args.level_timeout, start_timeout_s=args.start_timeout, model_name=args.model,
        engine_flags=(*engine.ENGINE_FLAGS, *(VISION.vllm_args if args.vision else ()), *args.engine_flag),
        log_level=args.log_level, seed=args.seed, idle_s=args.idle_seconds, vision=args.vision)
    if args.vision and args.model == engine.EngineBenchConfig.model_name:
        cfg = dataclasses.replace(cfg, model_name=VISION_MODEL)
    started = datetime.datetime.now().astimezone()
    _emit(f"# {started:%Y-%m-%d %H:%M %Z}; {_machine_line()}")
    records, seed = engine.run(cfg, _emit)
    goal = engine.goal_lines(records) + engine_grpc.peer_lines(records)
    goal_head = (f"Goal: frontend tier CPU/req <= vLLM's API server process CPU/req, TTFT p50 within "
                 f"±{engine.TTFT_TOLERANCE:.0%} of vLLM's server's; and (issue 40 item 4) the frontend total "
                 "(everything outside the engine) <= vLLM's API server and <= SMG's router + servicer:")
    _emit("\n" + engine.text_table(records) + "\n\n" + engine.LEGEND
          + ("\n\n" + goal_head + "\n" + "\n".join(goal) if goal else ""))
    if args.markdown:
        bg = ", ".join(f"{r.deployment} c{r.stats.concurrency}: {r.bg_cores:.2f}" for r in records)
        goal_md = ("\n\n" + goal_head + "\n\n" + "\n".join(f"- {g}" for g in goal)) if goal else ""
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {_machine_line()}.\n"
                    f"Setting: {engine.setting_line(cfg, seed)}.\n\n{engine.markdown_table(records)}\n\n"
                    f"{engine.LEGEND} CPU used by other tenants during each level, in cores: {bg}.{goal_md}\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": dataclasses.asdict(cfg), "seed": seed,
                                               "levels": [r.as_json() for r in records], "goal": goal},
                                              indent=1, default=str))
    return 0


def _run_soak(args: argparse.Namespace, command: str) -> int:
    from bench.soak import SoakConfig, report, run

    cfg = SoakConfig(minutes=args.minutes, warmup_minutes=args.warmup_minutes, concurrency=args.concurrency,
                     max_tokens=args.max_tokens, workers=args.workers, speedup=args.speedup,
                     sample_s=args.sample_seconds, shape=args.shape)
    started = datetime.datetime.now().astimezone()
    _emit(f"# {started:%Y-%m-%d %H:%M %Z}; {_machine_line()}; {cfg}")
    result = run(cfg, _emit)
    table = report(result)
    _emit("\n" + table)
    if args.json:
        Path(args.json).write_text(json.dumps({"config": dataclasses.asdict(cfg), "wall_s": result.wall_s,
                                               "counts": dataclasses.asdict(result.counts),
                                               "samples": result.samples}, indent=1))
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {_machine_line()}.\n"
                    f"Setting: {cfg}.\n\n{table}\n")
    return 0


def _run_kv(args: argparse.Namespace, command: str) -> int:
    from bench.kv import KvBenchConfig, main_kv

    cfg = KvBenchConfig(requests=args.requests, concurrency=args.concurrency, num_gpu_blocks=args.num_gpu_blocks,
                        workers=args.workers, max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens,
                        speedup=args.speedup, shapes=args.shape)
    started = datetime.datetime.now().astimezone()
    _emit(f"# {started:%Y-%m-%d %H:%M %Z}; {_machine_line()}; {cfg}")
    table = main_kv(cfg, tuple(c.strip() for c in args.cases.split(",") if c.strip()), _emit)
    _emit("\n" + table)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {_machine_line()}.\n"
                    f"Setting: {cfg}.\n\n{table}\n")
    return 0


def _config(args: argparse.Namespace, shapes: tuple[str, ...]) -> mesh.MeshBenchConfig:
    return mesh.MeshBenchConfig(
        shapes=shapes, concurrency=args.concurrency, requests=args.requests or None,
        prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, speedup=getattr(args, "speedup", 0.0),
        workers=getattr(args, "workers", 0), gateways=getattr(args, "gateways", 1), warmup=args.warmup,
        shared_prefix_tokens=args.shared_prefix_tokens,
        level_timeout_s=args.level_timeout, router_mode=getattr(args, "router_mode", "round-robin"),
        model_name=args.model, worker_flags=tuple(getattr(args, "worker_flag", ())),
        postprocessor_flags=tuple(getattr(args, "postprocessor_flag", ())),
        gateway_flags=tuple(getattr(args, "gateway_flag", ())),
        log_level=getattr(args, "log_level", "WARNING"), seed=args.seed,
        idle_s=args.idle_seconds, profile_dir=getattr(args, "profile", ""),
        profile_processes=getattr(args, "profile_process", ()), profile_native=getattr(args, "profile_native", False),
        otlp_endpoint=getattr(args, "otlp_endpoint", ""))


def _setting_line(args: argparse.Namespace, cfg: mesh.MeshBenchConfig) -> str:
    engine = ""
    if args.scenario == "mesh":
        pace = "instant" if cfg.speedup == 0 else f"speed-up {cfg.speedup:g}"
        gateways = f", {cfg.gateways} gateway processes" if cfg.gateways > 1 else ""
        engine = f"{cfg.workers} mocker workers ({pace}), router {cfg.router_mode}{gateways}; "
    return (f"{engine}prompts ~{cfg.prompt_tokens} words (+ chat template), {cfg.max_tokens} tokens out "
            f"(ignore_eos), requests/level {cfg.requests or 'max(200, 8*c)'}, warm-up {cfg.warmup}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = "python -m bench " + shlex.join(argv)
    started = datetime.datetime.now().astimezone()
    _emit(f"$ {command}")
    # The scenarios with runners of their own; mesh and external share the level loop below.
    runners = {"kv": _run_kv, "vision": _run_vision, "soak": _run_soak, "engine": _run_engine,
               "embeddings": _run_embeddings, "tokenizers": _run_tokenizers, "multiturn": multiturn.run_cli,
               "images": cli_fleets.run_images, "disagg": cli_fleets.run_disagg,
               "media-transfer": cli_fleets.run_media_transfer, "scale": cli_scale.run_scale,
               "tenants": tenants.run_tenants, "idle": idle.run_idle}
    if args.scenario in runners:
        return runners[args.scenario](args, command)
    cfg = _config(args, args.shape if args.scenario == "mesh" else ("external",))
    _emit(f"# {started:%Y-%m-%d %H:%M %Z}; {_machine_line()}")
    _emit(f"# {_setting_line(args, cfg)}")
    rounds: list[list[mesh.LevelRecord]] = []
    if args.scenario == "mesh":
        for number in range(1, args.rounds + 1):  # interleaved: every shape once per round, in the order given
            if args.rounds > 1:
                _emit(f"# round {number} of {args.rounds}")
            rounds.append([record for shape in cfg.shapes for record in mesh.run_shape(cfg, shape, _emit)])
    else:
        rounds = [_run_external(args, cfg)]
    records = [r for recs in rounds for r in recs]
    rows = [r.row for r in records]
    floor = floor_lines([[r.row for r in recs] for recs in rounds])
    _emit("\n" + text_table(rows) + "\n\n" + LEGEND + "".join("\n" + line for line in floor))
    if args.markdown:
        _append_markdown(Path(args.markdown), command, started, args, cfg, records, floor)
    if args.json:
        Path(args.json).write_text(json.dumps([{"round": n, **_record_json(r)} for n, recs in enumerate(rounds, 1)
                                               for r in recs], indent=1, default=str))
    return 0


def floor_lines(rounds: list[list[Row]]) -> list[str]:
    """Each shape's CPU per request against the ``edge`` floor's at the same concurrency (none without it); with
    several rounds, each round's against its own floor, then their median and range."""
    from bench.edge_floor import ratio_spread, ratios

    per_round = [[(r.shape, r.stats.concurrency, r.cpu_per_request) for r in rows] for rows in rounds]
    if len(per_round) == 1:
        return ratios(per_round[0])
    return [f"round {n}: {line}" for n, rows in enumerate(per_round, 1) for line in ratios(rows)] + \
        ratio_spread(per_round)


def _run_external(args: argparse.Namespace, cfg: mesh.MeshBenchConfig) -> list[mesh.LevelRecord]:
    pids = {name: int(pid) for name, pid in (item.split("=", 1) for item in args.pid)}
    return mesh.run_async(mesh.drive(args.url, pids, cfg, "external", _emit))


def _record_json(r: mesh.LevelRecord) -> dict:
    row: Row = r.row
    return {"shape": row.shape, "stats": row.stats.as_dict(), "cpu_ms_per_request": row.cpu_per_request,
            "client_cpu_ms_per_request": row.client_cpu_per_request, "window_cpu_ms": row.window_cpu_ms,
            "bg_cores": r.bg_cores, "loadavg": r.loadavg, "idle_ms_per_s": r.idle_ms_per_s,
            "chunks_per_message": r.chunks_per_message}


def _append_markdown(path: Path, command: str, started: datetime.datetime, args: argparse.Namespace,
                     cfg: mesh.MeshBenchConfig, records: list[mesh.LevelRecord], floor: list[str]) -> None:
    bg = ", ".join(f"{r.row.shape} c{r.row.stats.concurrency}: {r.bg_cores:.2f}" for r in records)
    idle = {r.row.shape: r.idle_ms_per_s for r in records if r.idle_ms_per_s}
    idle_text = "".join(f" Idle CPU of the {shape} mesh, ms per second: {mesh.fmt_groups(v)}."
                        for shape, v in idle.items())
    shared = "; ".join(f"{r.row.shape} c{r.row.stats.concurrency}: " + ", ".join(
        f"{rpc} {n:.1f}" for rpc, n in r.chunks_per_message.items()) for r in records if r.chunks_per_message)
    if shared:
        idle_text += f" Request outputs per multiplexed message: {shared}."
    section = (f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {_machine_line()}.\n"
               f"Setting: {_setting_line(args, cfg)}.\n\n{markdown_table([r.row for r in records])}\n\n"
               f"{LEGEND} CPU used by other tenants during each level, in cores: {bg}.{idle_text}\n"
               + "".join(f"\n- {line}" for line in floor) + ("\n" if floor else ""))
    with path.open("a") as f:
        f.write(section)
