"""``meshfront build-model`` (``python -m services.models``): build a demo model directory, with ``--tokenizer``
one whose tokenizer is not a tokenizer.json (services/models/tokenizer_models.py), or with ``--diffusion`` the
tiny diffusers pipelines (services/models/tiny_diffusion.py)."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence

from services.models.build import DEFAULT_CONTEXT_LENGTH, DEFAULT_NAME, build_demo_model, remove_build


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.models", description=__doc__)
    p.add_argument("--out", required=True, help="directory to build into")
    p.add_argument("--name", default=DEFAULT_NAME, help="model name recorded in config.json")
    p.add_argument("--context-length", type=int, default=DEFAULT_CONTEXT_LENGTH)
    p.add_argument("--with-weights", action="store_true", help="also save tiny random Qwen2 weights (torch)")
    p.add_argument("--diffusion", action="store_true",
                   help="build the tiny random diffusers pipelines instead (text-to-image, image-to-image, "
                        "text-to-video subdirectories; torch and diffusers)")
    p.add_argument("--tokenizer", choices=("tiktoken", "sentencepiece", "remote-code"), default=None,
                   help="a tiny model whose tokenizer is a Kimi-style tiktoken.model, a SentencePiece-only "
                        "tokenizer.model, or a class in the directory (served with --trust-remote-code)")
    p.add_argument("--clean", action="store_true", help="delete the directory first")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
    if args.clean:
        remove_build(args.out)
    start = time.monotonic()
    if args.tokenizer:
        from services.models.tokenizer_models import build_tokenizer_model

        out = build_tokenizer_model(args.tokenizer, args.out)
    elif args.diffusion:
        from services.models.tiny_diffusion import build_tiny_diffusion

        out = build_tiny_diffusion(args.out)
    else:
        out = build_demo_model(args.out, name=args.name, with_weights=args.with_weights,
                               context_length=args.context_length)
    print(f"{out} ({time.monotonic() - start:.1f} s)")
    return 0
