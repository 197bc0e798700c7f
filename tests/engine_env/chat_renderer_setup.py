"""What the chat-processor renderer tests of each engine environment share (tests/engine_env/vllm and
tests/engine_env/sglang, ``test_*_chat_renderer.py``): the demo model, which only the main environment builds,
and the preprocessor as ``meshfront preprocessor --chat-processor NAME`` runs it, serving that model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from services.common.discovery import ModelCard
from services.preprocessor.core.renderers import load_chat_renderer
from services.preprocessor.service import Preprocessor

REPO = Path(__file__).resolve().parents[2]
NAME = "demo"  # the model's served name in these tests


def demo_model_dir(*, with_weights: bool = False) -> str:
    """The demo model's directory, built by the main environment (the packaged tokenizer lives there)."""
    python = REPO / ".venv" / "bin" / "python"
    code = ("from services.models import default_test_model_dir; "
            f"print(default_test_model_dir(with_weights={with_weights}))")
    out = subprocess.run([str(python), "-c", code], cwd=REPO, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "gen" / "python")])})
    return out.stdout.strip().splitlines()[-1]


def chat_preprocessor(model_dir: str, chat_processor: str, context_length: int, **options: Any) -> Preprocessor:
    """The preprocessor with that chat processor's renderer, serving the model as ``NAME``; ``options`` are the
    deployment's (``chat_template``, ``hide_tools_for_choice_none``, ...)."""
    card = ModelCard(name=NAME, model_dir=model_dir, context_length=context_length)
    return Preprocessor(lambda name: card if name == NAME else None, chat_renderer=load_chat_renderer(chat_processor),
                        **options)
