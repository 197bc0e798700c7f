"""``meshfront run --demo-vision`` and ``--demo-audio``: one more worker each, serving a tiny random multimodal
model built in code.

- ``meshfront/demo-qwen-vl`` (services/models/qwen_vl.py), a Qwen2-VL that takes images and videos;
- ``meshfront/demo-qwen-audio`` (services/models/qwen_audio.py), a Qwen2-Audio that takes ``input_audio``.

With the mocker (the default) the worker takes the media as the preprocessor placed them and simulates their
tokens and salted KV blocks; with ``--worker-kind vllm`` vLLM's CPU build runs the real network on them. The
worker's card declares the modalities either way: the mocker by flag, vLLM from the engine's model config.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Callable
from pathlib import Path

from services.launcher.plan import WorkerSpec
from services.models import qwen_audio, qwen_vl

DEMO_PARSERS = ("--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")


@dataclasses.dataclass(frozen=True)
class MediaDemo:
    flag: str
    name: str  # the model's name
    build: Callable[..., Path]  # (out_dir, *, with_weights) -> the model directory, built on first use
    dir_name: str  # under build/models
    takes: str  # for --help
    modalities: str  # the mocker's --input-modalities
    vllm_args: tuple[str, ...]  # what vLLM's CPU build needs beside the engine flags

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def workers(self, args: argparse.Namespace, build_dir: Path, default_engine_args: str) -> list[WorkerSpec]:
        """This demo's worker (none without its flag); builds its model directory on first use."""
        if not getattr(args, self.dest):
            return []
        print(f"building the demo model {self.name} ...", flush=True)
        model_dir = str(self.build(build_dir / self.dir_name, with_weights=args.worker_kind == "vllm"))
        if args.worker_kind == "vllm":
            engine = shlex.split(default_engine_args if args.engine_args is None else args.engine_args)
            return [WorkerSpec(model_dir, self.name, "vllm", (*engine, *self.vllm_args, *DEMO_PARSERS))]
        return [WorkerSpec(model_dir, self.name, "mocker", ("--input-modalities", self.modalities, "--speedup-ratio",
                                                            str(args.speedup_ratio), *DEMO_PARSERS))]


VISION = MediaDemo(
    "--demo-vision", qwen_vl.NAME, qwen_vl.build_vision_model, "demo-qwen-vl",
    "a tiny random Qwen2-VL that takes images and videos", "image,video",
    # One video a prompt (its frames are the vision tower's largest input on a CPU; without_torchvision/ processes
    # it in vLLM's CPU build). Skipping the encoder's profiling run saves minutes on a CPU: it would push the
    # vision tower's whole budget of maximum-size images through once.
    ("--limit-mm-per-prompt", '{"image": 4, "video": 1}', "--skip-mm-profiling"))
AUDIO = MediaDemo(
    "--demo-audio", qwen_audio.NAME, qwen_audio.build_audio_model, "demo-qwen-audio",
    "a tiny random Qwen2-Audio that takes input_audio", "audio",
    # One clip a prompt; without the profiling run a maximum-length clip is not pushed through the audio tower.
    ("--limit-mm-per-prompt", '{"audio": 1}', "--skip-mm-profiling"))
DEMOS = (VISION, AUDIO)


def add_flags(p: argparse.ArgumentParser) -> None:
    for demo in DEMOS:
        p.add_argument(demo.flag, action="store_true",
                       help=f"one more worker serving {demo.name}, {demo.takes} "
                            "(mocker: simulated media tokens; --worker-kind vllm: vLLM's CPU build)")


def check(args: argparse.Namespace) -> None:
    for demo in DEMOS:
        if getattr(args, demo.dest) and args.worker_kind not in ("mocker", "vllm"):
            raise ValueError(f"{demo.flag} runs on the mocker or vllm, not {args.worker_kind}")


def count(args: argparse.Namespace) -> int:
    return sum(1 for demo in DEMOS if getattr(args, demo.dest))


def workers(args: argparse.Namespace, build_dir: Path, default_engine_args: str) -> list[WorkerSpec]:
    return [w for demo in DEMOS for w in demo.workers(args, build_dir, default_engine_args)]
