"""``meshfront run --demo-audio``: one more worker, serving the demo audio model ``meshfront/demo-qwen-audio``.

A tiny random Qwen2-Audio built in code (services/models/qwen_audio.py). With the mocker (the default) it takes
``input_audio`` clips as the preprocessor placed them and simulates their tokens and salted KV blocks; with
``--worker-kind vllm`` vLLM's CPU build runs the real network on them. The worker's card declares ``audio``
either way: the mocker by flag, vLLM from the engine's model config.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from services.launcher.plan import WorkerSpec
from services.launcher.vision_demo import DEMO_PARSERS
from services.models.qwen_audio import NAME, build_audio_model

# One clip a prompt. Skipping the encoder's profiling run saves time on a CPU (it would push a maximum-length
# clip through the audio tower once).
VLLM_AUDIO_ARGS = ("--limit-mm-per-prompt", '{"audio": 1}', "--skip-mm-profiling")


def add_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--demo-audio", action="store_true",
                   help=f"one more worker serving {NAME}, a tiny random Qwen2-Audio that takes input_audio "
                        "(mocker: simulated audio tokens; --worker-kind vllm: vLLM's CPU build)")


def check(args: argparse.Namespace) -> None:
    if args.demo_audio and args.worker_kind not in ("mocker", "vllm"):
        raise ValueError(f"--demo-audio runs on the mocker or vllm, not {args.worker_kind}")


def count(args: argparse.Namespace) -> int:
    return 1 if args.demo_audio else 0


def audio_workers(args: argparse.Namespace, build_dir: Path, default_engine_args: str) -> list[WorkerSpec]:
    """The demo audio worker (none without --demo-audio); builds its model directory on first use."""
    if not args.demo_audio:
        return []
    print(f"building the demo audio model {NAME} ...", flush=True)
    model_dir = str(build_audio_model(build_dir / "demo-qwen-audio", with_weights=args.worker_kind == "vllm"))
    if args.worker_kind == "vllm":
        engine = shlex.split(default_engine_args if args.engine_args is None else args.engine_args)
        return [WorkerSpec(model_dir, NAME, "vllm", (*engine, *VLLM_AUDIO_ARGS, *DEMO_PARSERS))]
    return [WorkerSpec(model_dir, NAME, "mocker", ("--input-modalities", "audio", "--speedup-ratio",
                                                   str(args.speedup_ratio), *DEMO_PARSERS))]
