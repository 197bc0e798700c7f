"""``meshfront run --demo-vision``: one more worker, serving the demo vision model ``meshfront/demo-qwen-vl``.

A tiny random Qwen2-VL built in code (services/models/qwen_vl.py). With the mocker (the default) it
takes images as the preprocessor placed them and simulates their tokens and salted KV blocks; with
``--worker-kind vllm`` vLLM's CPU build runs the real network on them. The worker's card declares
``image`` and ``video`` either way: the mocker by flag, vLLM from the engine's model config.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from services.launcher.plan import WorkerSpec
from services.models.qwen_vl import NAME, build_vision_model

# One video a prompt (its frames are the vision tower's largest input on a CPU; without_torchvision/ processes
# it in vLLM's CPU build). Skipping the encoder's profiling run saves minutes on a
# CPU: it would push the vision tower's whole budget of maximum-size images through once.
VLLM_VISION_ARGS = ("--limit-mm-per-prompt", '{"image": 4, "video": 1}', "--skip-mm-profiling")
DEMO_PARSERS = ("--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")


def add_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--demo-vision", action="store_true",
                   help=f"one more worker serving {NAME}, a tiny random Qwen2-VL that takes images and videos "
                        "(mocker: simulated media tokens; --worker-kind vllm: vLLM's CPU build)")


def check(args: argparse.Namespace) -> None:
    if args.demo_vision and args.worker_kind not in ("mocker", "vllm"):
        raise ValueError(f"--demo-vision runs on the mocker or vllm, not {args.worker_kind}")


def count(args: argparse.Namespace) -> int:
    return 1 if args.demo_vision else 0


def vision_workers(args: argparse.Namespace, build_dir: Path, default_engine_args: str) -> list[WorkerSpec]:
    """The demo vision worker (none without --demo-vision); builds its model directory on first use."""
    if not args.demo_vision:
        return []
    print(f"building the demo vision model {NAME} ...", flush=True)
    model_dir = str(build_vision_model(build_dir / "demo-qwen-vl", with_weights=args.worker_kind == "vllm"))
    if args.worker_kind == "vllm":
        engine = shlex.split(default_engine_args if args.engine_args is None else args.engine_args)
        return [WorkerSpec(model_dir, NAME, "vllm", (*engine, *VLLM_VISION_ARGS, *DEMO_PARSERS))]
    return [WorkerSpec(model_dir, NAME, "mocker", ("--input-modalities", "image,video", "--speedup-ratio",
                                                   str(args.speedup_ratio), *DEMO_PARSERS))]
