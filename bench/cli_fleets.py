"""The scenarios that start a fleet of their own rather than the level loop of ``mesh``: ``disagg``
(bench/disagg.py), ``images`` (bench/images.py) and ``media-transfer`` (bench/media_transfer.py). Each is a
parser (``add_*_parser``) and a runner (``run_*``) that bench/cli.py dispatches to."""

from __future__ import annotations

import argparse
import datetime
import tempfile
from pathlib import Path

from bench.cli_common import emit, ints, machine_line, speedup


def add_disagg_parser(sub) -> None:
    from bench.disagg import SHAPES as DISAGG_SHAPES
    from bench.disagg import DisaggBenchConfig

    d = DisaggBenchConfig()
    g = sub.add_parser("disagg", help="the same mocker workers aggregated and disaggregated (1 prefill + N-1 "
                       "decode), and Dynamo 1.6.1's both ways, on long prompts mixed with short chats")
    g.add_argument("--shape", default=",".join(d.shapes), help=f"comma list of {', '.join(DISAGG_SHAPES)}")
    g.add_argument("--workers", type=int, default=d.workers, help="workers per shape (disaggregated: 1 prefill)")
    g.add_argument("--concurrency", type=int, default=d.concurrency)
    g.add_argument("--requests", type=int, default=d.requests, help="measured requests per shape")
    g.add_argument("--long-share", type=float, default=d.long_share, help="share of long prompts")
    g.add_argument("--long-words", type=ints, default=(d.long_min, d.long_max), help="long prompts' min,max words")
    g.add_argument("--short-words", type=ints, default=(d.short_min, d.short_max), help="short chats' min,max words")
    g.add_argument("--max-tokens", type=int, default=d.max_tokens)
    g.add_argument("--speedup", type=speedup, default=d.speedup, help="mocker --speedup-ratio (default 1 = paced)")
    g.add_argument("--warmup", type=int, default=d.warmup)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--seeds", type=ints, default=(), help="comma list: every shape once per seed, then a table "
                   "pooled over them (p99s over every request); replaces --seed")
    g.add_argument("--markdown", default="", help="append the table to this file")
    g.add_argument("--allinone", action="store_true", help="Meshfront's frontend as the all-in-one gateway (one "
                   "process, as Dynamo's is) instead of the split mesh")
    g.add_argument("--profile", default="", metavar="DIR", help="py-spy Meshfront's processes during each measured "
                   "load; collapsed stacks go to DIR, top frames are printed")


def run_disagg(args: argparse.Namespace, command: str) -> int:
    from bench.disagg import SHAPES as DISAGG_SHAPES
    from bench.disagg import DisaggBenchConfig, main_disagg

    shapes = tuple(s.strip() for s in args.shape.split(",") if s.strip())
    bad = [s for s in shapes if s not in DISAGG_SHAPES]
    if bad or not shapes:
        raise SystemExit(f"unknown shape(s) {bad}; choose from {DISAGG_SHAPES}")
    cfg = DisaggBenchConfig(shapes=shapes, workers=args.workers, concurrency=args.concurrency, requests=args.requests,
                            long_share=args.long_share, long_min=args.long_words[0], long_max=args.long_words[-1],
                            short_min=args.short_words[0], short_max=args.short_words[-1], max_tokens=args.max_tokens,
                            speedup=args.speedup, warmup=args.warmup, seed=args.seed, seeds=args.seeds,
                            profile_dir=args.profile, allinone=args.allinone)
    started = datetime.datetime.now().astimezone()
    emit(f"# {started:%Y-%m-%d %H:%M %Z}; {machine_line()}; {cfg}")
    table = main_disagg(cfg, emit)
    emit("\n" + table)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {machine_line()}.\n"
                    f"Setting: {cfg}.\n\n{table}\n")
    return 0


def add_images_parser(sub) -> None:
    from bench.images import LEGS, ImageBenchConfig

    d = ImageBenchConfig()
    i = sub.add_parser("images", help="the tiny diffusers pipeline in-process vs behind `meshfront diffusers` vs "
                       "POST /v1/images/generations through a fresh mesh")
    i.add_argument("--legs", default=",".join(d.legs), help=f"comma list of {', '.join(LEGS)}")
    i.add_argument("--images", type=int, default=d.images, help="images per leg (one after another)")
    i.add_argument("--warmup", type=int, default=d.warmup, help="warm-up images before each leg")
    i.add_argument("--size", type=int, default=d.size, help="width and height in pixels")
    i.add_argument("--steps", type=int, default=d.steps, help="denoising steps per image")
    i.add_argument("--threads", type=int, default=d.threads, help="torch threads of the worker and the direct leg")
    i.add_argument("--rounds", type=int, default=d.rounds, help="rounds the legs alternate in")
    i.add_argument("--log-level", default=d.log_level, help="log level of the mesh services")
    i.add_argument("--markdown", default="", help="append a markdown section with the table to this file")


def run_images(args: argparse.Namespace, command: str) -> int:

    from bench import images

    legs = tuple(s.strip() for s in args.legs.split(",") if s.strip())
    if bad := [leg for leg in legs if leg not in images.LEGS]:
        raise SystemExit(f"unknown leg(s) {bad}; choose from {images.LEGS}")
    cfg = images.ImageBenchConfig(legs=legs, images=args.images, warmup=args.warmup, size=args.size,
                                  steps=args.steps, threads=args.threads, rounds=args.rounds,
                                  log_level=args.log_level)
    started = datetime.datetime.now().astimezone()
    emit(f"# {started:%Y-%m-%d %H:%M %Z}; {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="bench-images-") as logs:
        rows = images.run(cfg, emit, Path(logs))
    table = images.markdown_table(rows)
    emit("\n" + table + "\n\n" + images.LEGEND)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {machine_line()}.\n"
                    f"Setting: {cfg}.\n\n{table}\n\n{images.LEGEND}\n")
    return 0


def add_media_transfer_parser(sub) -> None:
    from bench.media_transfer import LEGS, TransferBenchConfig

    d = TransferBenchConfig()
    t = sub.add_parser("media-transfer", help="MB/s of a ~50 MB video through Envoy (b64_json, url download, the "
                       "gateway's gRPC download) and the memory each process uses while it passes")
    t.add_argument("--legs", default=",".join(d.legs), help=f"comma list of {', '.join(LEGS)}")
    t.add_argument("--size", default=d.size, help="WIDTHxHEIGHT of the video")
    t.add_argument("--frames", type=int, default=d.frames, help="frames (noise: ~0.53 MB each at 1280x720)")
    t.add_argument("--fps", type=float, default=d.fps)
    t.add_argument("--generations", type=int, default=d.generations, help="b64_json requests")
    t.add_argument("--downloads", type=int, default=d.downloads, help="downloads per download leg")
    t.add_argument("--sample-ms", type=float, default=d.sample_ms, help="memory sampling period")
    t.add_argument("--log-level", default=d.log_level, help="log level of the mesh services")
    t.add_argument("--markdown", default="", help="append a markdown section with the tables to this file")


def run_media_transfer(args: argparse.Namespace, command: str) -> int:

    from bench import media_transfer as mt

    legs = tuple(s.strip() for s in args.legs.split(",") if s.strip())
    if bad := [leg for leg in legs if leg not in mt.LEGS]:
        raise SystemExit(f"unknown leg(s) {bad}; choose from {mt.LEGS}")
    cfg = mt.TransferBenchConfig(legs=legs, size=args.size, frames=args.frames, fps=args.fps,
                                 generations=args.generations, downloads=args.downloads, sample_ms=args.sample_ms,
                                 log_level=args.log_level)
    started = datetime.datetime.now().astimezone()
    emit(f"# {started:%Y-%m-%d %H:%M %Z}; {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="bench-media-transfer-") as logs:
        transfers, memory, hwm = mt.run(cfg, emit, Path(logs))
    tables = mt.transfer_table(transfers) + "\n\n" + mt.memory_table(memory, hwm)
    emit("\n" + tables + "\n\n" + mt.LEGEND)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {machine_line()}.\n"
                    f"Setting: {cfg}.\n\n{tables}\n\n{mt.LEGEND}\n")
    return 0
